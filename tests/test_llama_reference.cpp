// The external oracle for Llama: a tiny Llama (grouped-query attention, RoPE, SwiGLU,
// RMSNorm; untied and tied heads) against the same model written with PyTorch's own ops
// in float64 (tests/reference/llama_torch.py), from the same weights and tokens: the
// loss within 1e-5 relative and every parameter gradient within 1e-4 relative (L2), fp32
// against float64. Needs python3 with torch: tests/cli/llama_reference.sh installs
// Debian's python3-torch when it is missing and runs this with PIPETRAIN_TORCH_PYTHON; without
// it the test is skipped, saying why. PIPETRAIN_TORCH_PYTHON names the interpreter.
// The same weights exported to Hugging Face (`pipetrain ckpt export-hf`) give the same
// loss under Hugging Face's own rotate-half convention, and import back bit for bit.
// A Mixtral-shaped model (every block 4 experts, top 2, softmax renormalised) runs the same
// way against Hugging Face's MixtralSparseMoeBlock conventions, and through Mixtral's files.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "model_fixtures.hpp"
#include "pipetrain/backend/backend.hpp"
#include "pipetrain/core/rng.hpp"
#include "pipetrain/io/checkpoint.hpp"
#include "pipetrain/io/hf_checkpoint.hpp"
#include "pipetrain/model/stage.hpp"

namespace pipetrain {
namespace {

ModelConfig reference_llama(bool tied) {
  ModelConfig m;
  m.arch = "llama";
  m.n_layer = 2;
  m.n_head = 4;
  m.n_kv_head = 2;
  m.d_model = 32;
  m.ffn_hidden = 48;
  m.vocab_size = 61;  // padded to 128: the padded rows must stay out of the softmax
  m.max_seq_len = 16;
  m.rope_theta = 10000;
  m.tie_embeddings = tied;
  return m;
}

// Every block a Mixtral mixture of experts; no auxiliary losses (the oracle has the tokens' loss).
ModelConfig reference_mixtral() {
  ModelConfig m = reference_llama(false);
  m.n_experts = 4;
  m.top_k = 2;
  m.ffn_hidden = m.expert_ffn_hidden = 24;
  m.aux_loss_coeff = 0;
  return m;
}

struct Result {
  double loss = 0;
  std::map<std::string, std::vector<float>> grads;
};

TEST(LlamaTorchReference, LossAndEveryGradient) {
  const char* python = std::getenv("PIPETRAIN_TORCH_PYTHON");
  if (!python || !*python)
    GTEST_SKIP() << "needs python3 with torch: run tests/cli/llama_reference.sh (it installs python3-torch)";
  const std::vector<std::pair<std::string, ModelConfig>> cases = {
      {"untied", reference_llama(false)}, {"tied", reference_llama(true)}, {"Mixtral", reference_mixtral()}};
  for (const auto& [what, cfg] : cases) {
    SCOPED_TRACE(what);
    const bool tied = cfg.tie_embeddings;
    auto be = make_cpu_backend();
    auto pool = MemoryPool::create(*be);
    ParameterStore store;
    ModelStage model(cfg, 0, model_num_units(cfg), store);
    store.allocate(*pool, *be);
    store.initialize(7, *be);
    for (auto& p : store.params()) {  // norms away from 1: their gradients become generic
      if (p.name.find("router") != std::string::npos)  // logits of order 1: clear choices, generic weights
        for (int64_t i = 0; i < p.numel(); ++i) p.value.f32()[i] *= 25.0f;
      if (p.name.find("norm") == std::string::npos) continue;
      Rng rng = Rng::for_stream(3, p.name);
      for (int64_t i = 0; i < p.numel(); ++i) p.value.f32()[i] += static_cast<float>(0.2 * rng.normal());
    }
    store.zero_grads(*be);
    MicrobatchContext ctx;
    ctx.backend = be.get();
    ctx.pool = pool.get();
    ctx.B = 2;
    ctx.T = 12;
    const int N = ctx.B * ctx.T;
    ctx.tokens = testing::random_tokens(*pool, N, cfg.vocab_size, 21);
    ctx.targets = testing::random_tokens(*pool, N, cfg.vocab_size, 22);
    ctx.loss_scale = 1.0f / static_cast<float>(N);
    std::vector<std::unique_ptr<Stash>> stashes(model.layers().size());
    Tensor x;
    for (size_t i = 0; i < model.layers().size(); ++i) x = model.layers()[i]->forward(ctx, x, stashes[i]);
    double loss = 0;
    for (int i = 0; i < N; ++i) loss += x.f32()[i];
    loss /= N;
    Tensor dy;
    for (size_t i = model.layers().size(); i-- > 0;) dy = model.layers()[i]->backward(ctx, dy, *stashes[i]);

    nlohmann::json in;
    in["config"] = {{"d_model", cfg.d_model},       {"n_head", cfg.n_head},
                    {"n_kv_head", cfg.kv_heads()},  {"n_layer", cfg.n_layer},
                    {"vocab_size", cfg.vocab_size}, {"norm_eps", cfg.norm_eps},
                    {"rope_theta", cfg.rope_theta}, {"tie_embeddings", tied},
                    {"n_experts", cfg.n_experts},   {"top_k", cfg.top_k}};
    in["B"] = ctx.B;
    in["T"] = ctx.T;
    in["tokens"] = std::vector<int32_t>(ctx.tokens.i32(), ctx.tokens.i32() + N);
    in["targets"] = std::vector<int32_t>(ctx.targets.i32(), ctx.targets.i32() + N);
    for (const auto& p : store.params())
      in["params"][p.name] = {{"shape", p.shape}, {"data", std::vector<float>(p.value.f32(), p.value.f32() + p.numel())}};
    const std::string dir = ::testing::TempDir(), in_path = dir + "llama_ref_in.json",
                      out_path = dir + "llama_ref_out.json";
    std::ofstream(in_path) << in.dump();
    const std::string cmd = std::string(python) + " " + PIPETRAIN_SOURCE_DIR + "/tests/reference/llama_torch.py " +
                            in_path + " " + out_path;
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    const nlohmann::json out = nlohmann::json::parse(std::ifstream(out_path));

    const double ref_loss = out["loss"].get<double>();
    EXPECT_NEAR(loss, ref_loss, 1e-5 * std::abs(ref_loss));
    std::printf("  %s: loss %.8f (PyTorch float64 %.8f)\n", what.c_str(), loss, ref_loss);
    for (const auto& p : store.params()) {
      const std::vector<double> r = out["grads"].at(p.name).get<std::vector<double>>();
      ASSERT_EQ(r.size(), static_cast<size_t>(p.numel())) << p.name;
      double diff = 0, norm = 0;
      for (size_t i = 0; i < r.size(); ++i) {
        const double d = p.grad.f32()[i] - r[i];
        diff += d * d;
        norm += r[i] * r[i];
      }
      EXPECT_LE(std::sqrt(diff), 1e-4 * std::sqrt(norm)) << "gradient of " << p.name;
    }

    // Hugging Face: export, run its convention, import back.
    Config run;
    run.model = cfg;
    run.data.train = {"unset.h5"};
    run.train.seq_len = cfg.max_seq_len;
    CheckpointMeta meta;
    meta.config_toml = to_toml(run);
    std::vector<CheckpointTensor> tensors;
    for (auto& p : store.params()) {
      CheckpointTensor t;
      t.name = "params/" + p.name;
      t.global_shape = p.global_shape;
      t.data = p.value.f32();
      t.write = true;
      tensors.push_back(t);
    }
    const std::string ckpt = dir + "llama_ref.h5", hf_dir = dir + "llama_ref_hf", back = dir + "llama_ref_back.h5";
    write_checkpoint(ckpt, MPI_COMM_SELF, meta, tensors);
    export_hf(ckpt, hf_dir);
    const std::string hf_cmd = cmd + " --hf " + hf_dir;
    ASSERT_EQ(std::system(hf_cmd.c_str()), 0) << hf_cmd;
    const double hf_loss = nlohmann::json::parse(std::ifstream(out_path))["loss"].get<double>();
    EXPECT_NEAR(loss, hf_loss, 1e-5 * std::abs(hf_loss)) << "Hugging Face's convention on the exported weights";
    std::printf("  %s: Hugging Face export, rotate-half RoPE in PyTorch: loss %.8f\n", what.c_str(), hf_loss);
    const ModelConfig imported = import_hf(hf_dir, back);
    EXPECT_EQ(imported.kv_heads(), cfg.kv_heads());
    EXPECT_EQ(imported.tie_embeddings, tied);
    EXPECT_EQ(imported.n_experts, cfg.n_experts);
    EXPECT_EQ(imported.top_k, cfg.top_k);
    std::vector<std::vector<float>> read(store.params().size());
    std::vector<CheckpointTensor> again;
    for (size_t k = 0; k < store.params().size(); ++k) {
      const Parameter& p = store.params()[k];
      read[k].resize(static_cast<size_t>(p.numel()));
      CheckpointTensor t;
      t.name = "params/" + p.name;
      t.global_shape = p.global_shape;
      t.data = read[k].data();
      again.push_back(t);
    }
    read_checkpoint_tensors(back, MPI_COMM_SELF, again);
    for (size_t k = 0; k < store.params().size(); ++k) {
      const Parameter& p = store.params()[k];
      EXPECT_EQ(read[k], std::vector<float>(p.value.f32(), p.value.f32() + p.numel())) << "imported " << p.name;
    }
  }
}

}  // namespace
}  // namespace pipetrain
