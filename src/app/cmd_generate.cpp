// `pipetrain generate CKPT`: add_generate_command (declared in pipetrain/app/commands.hpp).
// Loads a checkpoint written on any grid into the whole model on one rank, encodes the
// prompt with the tokenizer the checkpoint records, and streams what the model writes.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "pipetrain/app/commands.hpp"
#include "pipetrain/backend/backend.hpp"
#include "pipetrain/backend/cuda.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/io/checkpoint.hpp"
#include "pipetrain/io/tokenizer.hpp"
#include "pipetrain/runtime/generator.hpp"
#include "pipetrain/runtime/trainer.hpp"
#include "pipetrain/topology/grid.hpp"

namespace pipetrain {
namespace {

struct GenerateOptions {
  std::string checkpoint, prompt, prompt_file, tokenizer, device = "cpu";
  int tokens = 200;
  SamplingOptions sampling;
  bool no_cache = false;
};

// A checkpoint file, or the newest of a checkpoint directory.
std::string checkpoint_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return path;
  const auto files = checkpoints_in(path);
  if (files.empty()) fail("{}: no checkpoints (step_*.h5) in this directory", path);
  return files.front();
}

// The bytes a generated token adds, held back while they end inside a UTF-8 character.
class Utf8Stream {
 public:
  void put(const std::string& bytes) {
    pending_ += bytes;
    size_t complete = pending_.size();
    for (size_t back = 1; back <= std::min<size_t>(3, pending_.size()); ++back) {
      const auto c = static_cast<unsigned char>(pending_[pending_.size() - back]);
      if ((c & 0xc0) == 0x80) continue;  // a continuation byte: look further back
      const size_t len = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
      if (len > back) complete = pending_.size() - back;
      break;
    }
    std::fwrite(pending_.data(), 1, complete, stdout);
    std::fflush(stdout);
    pending_.erase(0, complete);
  }
  void finish() {
    std::fwrite(pending_.data(), 1, pending_.size(), stdout);
    std::fflush(stdout);
  }

 private:
  std::string pending_;
};

void run_generate(const GenerateOptions& o) {
  const std::string path = checkpoint_file(o.checkpoint);
  const CheckpointMeta meta = read_checkpoint_meta(path);
  Config cfg = parse_config(meta.config_toml, path);
  // The whole model on this rank, forward only, in f32.
  cfg.parallel = ParallelConfig{};
  cfg.schedule.name = "1f1b";
  cfg.schedule.file.clear();
  cfg.train.global_batch = 1;
  cfg.train.microbatches = 1;
  cfg.train.precision = "fp32";
  cfg.train.recompute = "none";
  cfg.runtime.device = o.device;
  const std::string tokenizer_name = !o.tokenizer.empty() ? o.tokenizer : meta.tokenizer;
  if (tokenizer_name.empty())
    fail("{}: the checkpoint records no tokenizer (trained on data without one); name it with --tokenizer", path);
  const auto tok = make_tokenizer(tokenizer_name);
  if (tok->vocab_size() > cfg.model.vocab_size)
    fail("--tokenizer {}: {} tokens, more than the model's vocabulary of {}", tokenizer_name, tok->vocab_size(),
         cfg.model.vocab_size);

  std::string prompt = o.prompt;
  if (!o.prompt_file.empty()) {
    std::ifstream in(o.prompt_file, std::ios::binary);
    if (!in) fail("{}: cannot open", o.prompt_file);
    std::ostringstream s;
    s << in.rdbuf();
    prompt = s.str();
  }
  std::vector<int32_t> ids;
  tok->encode(prompt, ids, o.prompt_file.empty() ? "--prompt" : o.prompt_file);
  if (ids.empty()) {
    if (!tok->end_of_text()) fail("an empty prompt needs a tokenizer with an end-of-text token to start from");
    ids.push_back(*tok->end_of_text());  // GPT-2's convention: start a new document
  }

  std::unique_ptr<Backend> backend;
  if (o.device == "cpu") {
    backend = make_cpu_backend();
  } else {
    std::string why;
    if (!cuda_available(&why)) fail("--device cuda: {}", why);
    backend = make_cuda_backend();
  }
  Grid grid(MPI_COMM_SELF, cfg.parallel, path);
  Trainer trainer(cfg, grid, *backend, [](int64_t, int, int32_t*, int32_t*) {}, TrainerUse::Inference);
  trainer.load_checkpoint(path, true);
  Generator gen(cfg.model, trainer.stage(0), *backend, trainer.pool(), !o.no_cache, cfg.train.seq_len);
  Utf8Stream out;
  out.put(prompt);
  gen.generate(ids, o.tokens, o.sampling, [&](int32_t id) {
    if (tok->end_of_text() && id == *tok->end_of_text()) return false;  // the document ends
    out.put(tok->decode(std::span<const int32_t>(&id, 1)));
    return true;
  });
  out.finish();
  std::fputc('\n', stdout);
}

}  // namespace

void add_generate_command(CLI::App& app, CommandRunner& runner) {
  auto o = std::make_shared<GenerateOptions>();
  auto* g = app.add_subcommand("generate", "Write text with a trained model (a checkpoint of any grid, on one rank)");
  g->add_option("checkpoint", o->checkpoint, "Checkpoint file, or a checkpoint directory (its newest)")->required();
  auto* p = g->add_option("--prompt", o->prompt, "Text to continue");
  g->add_option("--prompt-file", o->prompt_file, "File whose text to continue")->excludes(p);
  g->add_option("--tokens", o->tokens, "Most tokens to write")->capture_default_str()->check(CLI::NonNegativeNumber);
  g->add_option("--temperature", o->sampling.temperature, "Softmax temperature (> 0)")->capture_default_str();
  g->add_option("--top-k", o->sampling.top_k, "Sample among the k most likely tokens (0: all)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  g->add_option("--top-p", o->sampling.top_p, "Sample among the most likely tokens holding probability p")
      ->capture_default_str();
  g->add_option("--seed", o->sampling.seed, "Sampling seed (the same seed gives the same text)")->capture_default_str();
  g->add_flag("--greedy", o->sampling.greedy, "Always the most likely token");
  g->add_flag("--no-kv-cache", o->no_cache, "Rerun the whole sequence for every token (for comparison)");
  g->add_option("--tokenizer", o->tokenizer, "Tokenizer (default: the one the checkpoint records)");
  g->add_option("--device", o->device, "cpu or cuda")->capture_default_str()->check(CLI::IsMember({"cpu", "cuda"}));
  run_on_rank0(g, runner, [o] { run_generate(*o); });
}

}  // namespace pipetrain
