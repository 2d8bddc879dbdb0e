// Packed documents (data.pack_documents): how documents are placed in sequences, how an
// HDF5 token file's documents are found and read, and that a packed sequence trains as
// its documents would each alone (losses and gradients, GPT-2 and Llama). Rotary angles
// depend on relative positions only, so under block-diagonal attention Llama would train
// the same with positions not restarting; the kernel test catches that mistake instead.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "model_fixtures.hpp"
#include "pipetrain/core/documents.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/io/batch_sampler.hpp"
#include "pipetrain/io/document_packing.hpp"
#include "pipetrain/io/token_dataset.hpp"
#include "pipetrain/io/token_writer.hpp"
#include "pipetrain/runtime/trainer.hpp"
#include "pipetrain/topology/grid.hpp"

namespace pipetrain {
namespace {

namespace fs = std::filesystem;

TEST(DocumentPacking, WholeDocumentsInStreamOrderLongOnesSplit) {
  // Documents of 5, 7, 1, 2 and 25 tokens into sequences of 8: the one-token document has
  // no target and is dropped; the 25 tokens go as pieces of 8, 8 and 8 whose last targets
  // are the next piece's first token (the 1-token rest predicts nothing: dropped).
  const std::vector<int64_t> boundaries = {0, 5, 12, 13, 15, 40};
  const DocumentPacking p(boundaries, 8);
  ASSERT_EQ(p.num_sequences(), 6);
  EXPECT_EQ(p.documents(), 5);
  EXPECT_EQ(p.documents_split(), 1);
  const std::vector<int64_t> targets = {4, 6, 1, 8, 8, 8};
  for (int64_t s = 0; s < 6; ++s) EXPECT_EQ(p.targets(s), targets[static_cast<size_t>(s)]) << "sequence " << s;
  ASSERT_EQ(p.pieces(2).size(), 1u);
  EXPECT_EQ(p.pieces(2)[0].first, 13);
  EXPECT_EQ(p.pieces(5)[0].first, 31);
  EXPECT_TRUE(p.pieces(5)[0].last_target);
  EXPECT_EQ(p.positions_filled(), 5 + 7 + 2 + 24);
  // Short documents share a sequence while they fit.
  const std::vector<int64_t> short_docs = {0, 3, 6, 8, 9, 12};
  const DocumentPacking q(short_docs, 8);
  ASSERT_EQ(q.num_sequences(), 2);
  EXPECT_EQ(q.pieces(0).size(), 3u);  // 3 + 3 + 2 (the 1-token one is dropped)
  EXPECT_EQ(q.targets(0), 2 + 2 + 1);
  EXPECT_EQ(q.targets(1), 2);
  EXPECT_THROW(q.pieces(2), Error);
}

class PackedDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    dir_ = fs::temp_directory_path() /
           ("pipetrain_packed_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

// GPT-2's end-of-text token (50256) ends each document, as `pipetrain data text --eot`
// writes it; inputs, targets and positions of the packed sequences.
TEST_F(PackedDatasetTest, EndOfTextTokensCutAnHdf5FileIntoDocuments) {
  const uint32_t E = 50256;
  const std::vector<uint32_t> tokens = {10, 11, 12, E, 20, 21, E, 30, 31, 32, 33, 34, E, 40, 41};
  write_token_file(path("t.h5"), tokens, 50257, "gpt2");
  const TokenDataset d({path("t.h5")}, 6, 50304, false, true);
  // Documents of 4, 3, 6 and 2 tokens: [4] [3] [6] [2] do not pair within 6 positions
  // except the last: 4 | 3 | 6 | 2.
  ASSERT_EQ(d.num_windows(), 4);
  std::vector<int32_t> in(6), tgt(6), pos(6);
  d.read_sample(0, in.data(), tgt.data(), pos.data());
  const int32_t X = kIgnoredTarget, e = static_cast<int32_t>(E);
  EXPECT_EQ(in, (std::vector<int32_t>{10, 11, 12, e, e, e}));
  EXPECT_EQ(tgt, (std::vector<int32_t>{11, 12, e, X, X, X}));
  EXPECT_EQ(pos, (std::vector<int32_t>{0, 1, 2, 3, 0, 1}));
  EXPECT_EQ(d.targets_in(0), 3);
  d.read_sample(2, in.data(), tgt.data(), pos.data());
  EXPECT_EQ(in, (std::vector<int32_t>{30, 31, 32, 33, 34, e}));
  EXPECT_EQ(tgt, (std::vector<int32_t>{31, 32, 33, 34, e, X}));
  EXPECT_EQ(d.targets_in(3), 1);  // the file's tail (40, 41) is a document too
  // The sampler gives the same, and counts the targets of a batch.
  BatchSampler s(d, "sequential", 1);
  EXPECT_EQ(s.targets(0, 4), 3 + 2 + 5 + 1);
  EXPECT_THROW(d.read_window(0, in.data()), Error);

  write_token_file(path("b.h5"), tokens, 65536, "byte");
  try {
    TokenDataset({path("b.h5")}, 6, 65536, false, true);
    ADD_FAILURE() << "a byte-tokenized file has no end-of-text token";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("b.h5"), std::string::npos) << err.what();
    EXPECT_NE(std::string(err.what()).find("end-of-text"), std::string::npos) << err.what();
  }
  EXPECT_THROW(TokenDataset({path("t.h5")}, 6, 50304, true, true), Error);  // respect_documents too
}

// A packed sequence trains as its documents each alone: the packed loss and gradient are
// the alone ones weighted by their targets (summed in another order: f32 sums of at most
// T(C + layers) terms, ~2^-24 each relative, bound 1e-4 relative plus 1e-6 of the largest).
struct Alone {
  double loss;
  std::vector<float> grads;
};

Alone train_once(const Config& cfg, BatchSource source) {
  auto backend = make_cpu_backend();
  Grid grid(MPI_COMM_SELF, cfg.parallel);
  Trainer trainer(cfg, grid, *backend, std::move(source));
  const StepMetrics m = trainer.train_step(0);
  return {m.loss, trainer.reduced_gradients()};
}

// Sequence `doc` tokens, the last predicting nothing.
BatchSource document_source(const std::vector<int32_t>& doc, int T) {
  auto load = [doc, T](int64_t, int, int32_t* in, int32_t* tgt, int32_t* pos) {
    const int L = static_cast<int>(doc.size());
    for (int t = 0; t < T; ++t) {
      if (in) in[t] = t < L ? doc[static_cast<size_t>(t)] : 0;
      if (tgt) tgt[t] = t + 1 < L ? doc[static_cast<size_t>(t) + 1] : kIgnoredTarget;
      if (pos) pos[t] = t < L ? t : t - L;
    }
  };
  return BatchSource::packed(load, [doc](int64_t, int) { return static_cast<int64_t>(doc.size()) - 1; });
}

void expect_packed_is_each_alone(Config cfg) {
  const std::vector<std::vector<int32_t>> docs = {{3, 9, 27, 31, 5}, {7, 7, 14, 21, 28, 35, 42}, {1, 2, 4}};
  const int T = 16;  // 15 tokens and one padding position
  cfg.train.seq_len = T;
  cfg.model.max_seq_len = T;
  cfg.train.global_batch = 1;
  cfg.train.microbatches = 1;
  std::vector<int32_t> packed;
  for (const auto& d : docs) packed.insert(packed.end(), d.begin(), d.end());
  auto load = [&](int64_t, int, int32_t* in, int32_t* tgt, int32_t* pos) {
    int t = 0;
    for (const auto& d : docs)
      for (size_t i = 0; i < d.size(); ++i, ++t) {
        if (in) in[t] = d[i];
        if (tgt) tgt[t] = i + 1 < d.size() ? d[i + 1] : kIgnoredTarget;
        if (pos) pos[t] = static_cast<int32_t>(i);
      }
    for (; t < T; ++t) {
      if (in) in[t] = 11;  // padding: whatever it holds, nothing reads it
      if (tgt) tgt[t] = kIgnoredTarget;
      if (pos) pos[t] = 0;
    }
  };
  const Alone whole = train_once(cfg, BatchSource::packed(load, [](int64_t, int) { return int64_t{12}; }));
  double loss = 0;
  std::vector<double> grads(whole.grads.size(), 0.0);
  for (const auto& d : docs) {
    const double w = static_cast<double>(d.size() - 1) / 12.0;  // its share of the targets
    const Alone a = train_once(cfg, document_source(d, T));
    loss += w * a.loss;
    for (size_t i = 0; i < grads.size(); ++i) grads[i] += w * a.grads[i];
  }
  EXPECT_NEAR(whole.loss, loss, 1e-5 * loss);
  double largest = 0;
  for (double g : grads) largest = std::max(largest, std::abs(g));
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < grads.size(); ++i)
    if (!(std::abs(whole.grads[i] - grads[i]) <= 1e-4 * std::abs(grads[i]) + 1e-6 * largest) && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0u) << "first at " << first << ": packed " << whole.grads[first] << ", alone " << grads[first];
}

Config tiny_packed_config() {
  Config c;
  c.model = testing::tiny_model();
  c.train.lr = 1e-3;
  c.train.grad_clip = 0.0;
  return c;
}

TEST(PackedDocuments, Gpt2TrainsAsEachDocumentAlone) { expect_packed_is_each_alone(tiny_packed_config()); }

TEST(PackedDocuments, LlamaTrainsAsEachDocumentAlone) {
  Config c = tiny_packed_config();
  c.model.arch = "llama";
  c.model.n_head = 4;
  c.model.n_kv_head = 2;
  c.model.ffn_hidden = 32;
  c.model.rope_theta = 10000;
  expect_packed_is_each_alone(c);
}

}  // namespace
}  // namespace pipetrain
