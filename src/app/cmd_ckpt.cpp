// `pipetrain ckpt`: add_ckpt_command (declared in pipetrain/app/commands.hpp).
//   pipetrain ckpt inspect CKPT.h5                 metadata, model, every dataset's shape
//   pipetrain ckpt verify CKPT.h5                  read every dataset, check its checksum
//   pipetrain ckpt import-llmc MODEL.bin -o OUT.h5 llm.c GPT-2 weights -> checkpoint
//   pipetrain ckpt export-llmc CKPT.h5 -o MODEL.bin checkpoint -> llm.c fp32 weights
//   pipetrain ckpt import-hf DIR -o OUT.h5        Hugging Face Llama -> checkpoint
//   pipetrain ckpt export-hf CKPT.h5 -o DIR       Llama checkpoint -> Hugging Face (F32)
// Runs on rank 0 only when launched with more ranks; errors throw pipetrain::Error.
#include <mpi.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "pipetrain/app/commands.hpp"
#include "pipetrain/core/config.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/io/checkpoint.hpp"
#include "pipetrain/io/hf_checkpoint.hpp"
#include "pipetrain/io/llmc_checkpoint.hpp"

namespace pipetrain {
namespace {

struct CkptOptions {
  std::string input;
  std::string out;
};

std::string shape_text(const std::vector<int64_t>& shape) {
  return shape.empty() ? std::string("scalar") : fmt::format("{}", fmt::join(shape, "x"));
}

void print_model(const ModelConfig& m) {
  fmt::print("model: arch {}, n_layer {}, n_head {}, d_model {}, vocab_size {} (padded {}), max_seq_len {}\n",
             m.arch, m.n_layer, m.n_head, m.d_model, m.vocab_size, m.padded_vocab(), m.max_seq_len);
}

void inspect(const std::string& path) {
  const CheckpointMeta meta = read_checkpoint_meta(path);
  const auto entries = list_checkpoint(path);
  fmt::print("{}: pipetrain checkpoint, format version {}\n", path, meta.format_version);
  fmt::print("step {}, tokens seen {}, samples seen {}, seed {}\n", meta.step, meta.tokens_seen,
             meta.samples_seen, meta.seed);
  fmt::print("grid {}, zero1 {}; schedule {}\n", meta.grid.text(), meta.zero1 ? "on" : "off",
             meta.schedule.empty() ? "(none)" : meta.schedule);
  try {
    print_model(parse_config(meta.config_toml, path).model);
  } catch (const Error& e) {
    fmt::print("model: the stored config does not parse: {}\n", e.what());
  }
  int64_t params = 0;
  size_t width = 0;
  for (const auto& e : entries) {
    width = std::max(width, e.name.size());
    if (e.name.rfind("params/", 0) == 0) {
      int64_t n = 1;
      for (auto d : e.shape) n *= d;
      params += n;
    }
  }
  fmt::print("datasets: {} ({} parameter values)\n", entries.size(), params);
  for (const auto& e : entries) fmt::print("  {:<{}}  {}\n", e.name, width, shape_text(e.shape));
}

void verify(const std::string& path) {
  const auto bad = verify_checkpoint(path);
  const size_t total = list_checkpoint(path).size();
  for (const auto& name : bad) fmt::print("{}: {}: checksum mismatch or read error\n", path, name);
  std::fflush(stdout);
  if (!bad.empty())
    fail("{}: {} of {} datasets failed verification (first: {})", path, bad.size(), total, bad.front());
  fmt::print("{}: {} datasets verified\n", path, total);
}

}  // namespace

void add_ckpt_command(CLI::App& app, CommandRunner& runner) {
  auto* ckpt = app.add_subcommand("ckpt", "Inspect, verify, import and export checkpoints");
  ckpt->require_subcommand(1);
  auto o = std::make_shared<CkptOptions>();

  auto* insp = ckpt->add_subcommand("inspect", "Print a checkpoint's metadata, model and datasets");
  insp->add_option("checkpoint", o->input, "Checkpoint file (.h5)")->required();
  run_on_rank0(insp, runner, [o] { inspect(o->input); });

  auto* ver = ckpt->add_subcommand("verify", "Read every dataset of a checkpoint and check its checksum");
  ver->add_option("checkpoint", o->input, "Checkpoint file (.h5)")->required();
  run_on_rank0(ver, runner, [o] { verify(o->input); });

  auto* imp = ckpt->add_subcommand("import-llmc", "Convert llm.c GPT-2 weights (.bin, fp32 or bf16) to a checkpoint");
  imp->add_option("model", o->input, "llm.c model file (e.g. gpt2_124M.bin)")->required();
  imp->add_option("-o,--output", o->out, "Checkpoint to write (.h5); train from it with --init")->required();
  run_on_rank0(imp, runner, [o] {
    const ModelConfig m = import_llmc(o->input, o->out);
    fmt::print("wrote {}: GPT-2 {} layers, {} heads, d_model {}, vocab {} (padded {}), max_seq_len {}; "
               "{} parameter values\n",
               o->out, m.n_layer, m.n_head, m.d_model, m.vocab_size, m.padded_vocab(), m.max_seq_len,
               llmc_num_params(m));
  });

  auto* exp = ckpt->add_subcommand("export-llmc", "Write a checkpoint's weights as an llm.c fp32 model file");
  exp->add_option("checkpoint", o->input, "Checkpoint file (.h5)")->required();
  exp->add_option("-o,--output", o->out, "llm.c model file to write (.bin)")->required();
  run_on_rank0(exp, runner, [o] {
    const ModelConfig m = export_llmc(o->input, o->out);
    fmt::print("wrote {}: llm.c version {} (fp32), {} parameter values\n", o->out, kLlmcVersionFp32,
               llmc_num_params(m));
  });

  auto* imh = ckpt->add_subcommand(
      "import-hf", "Convert a Hugging Face Llama or Mixtral (config.json + safetensors) to a checkpoint");
  imh->add_option("dir", o->input, "Hugging Face model directory")->required();
  imh->add_option("-o,--output", o->out, "Checkpoint to write (.h5); train from it with --init")->required();
  run_on_rank0(imh, runner, [o] {
    const ModelConfig m = import_hf(o->input, o->out);
    const std::string mlp = m.n_experts > 0
                                ? fmt::format("{} experts of width {} (top {})", m.n_experts, m.expert_ffn(), m.top_k)
                                : fmt::format("MLP {}", m.ffn());
    fmt::print("wrote {}: {} {} layers, {} heads ({} key/value), d_model {}, {}, vocab {}, {} head\n", o->out,
               m.n_experts > 0 ? "Mixtral" : "Llama", m.n_layer, m.n_head, m.kv_heads(), m.d_model, mlp, m.vocab_size,
               m.tie_embeddings ? "tied" : "untied");
  });

  auto* exh = ckpt->add_subcommand(
      "export-hf", "Write a Llama checkpoint's weights as a Hugging Face directory (Mixtral with experts)");
  exh->add_option("checkpoint", o->input, "Checkpoint file (.h5)")->required();
  exh->add_option("-o,--output", o->out, "Directory to write (config.json, model.safetensors)")->required();
  run_on_rank0(exh, runner, [o] {
    const ModelConfig m = export_hf(o->input, o->out);
    fmt::print("wrote {}: config.json and model.safetensors (F32), {} {} layers\n", o->out,
               m.n_experts > 0 ? "Mixtral" : "Llama", m.n_layer);
  });
}

}  // namespace pipetrain
