// `pipetrain data`: add_data_command (declared in pipetrain/app/commands.hpp).
//   pipetrain data text IN.txt... -o OUT.h5                     byte-level, vocab 256
//   pipetrain data llmc SHARD.bin... -o OUT.h5                  llm.c GPT-2 shards
//   pipetrain data raw FILE... --dtype u16|u32 --vocab N -o OUT.h5 [--tokenizer NAME]
//   pipetrain data info FILE.h5...                              what a token file holds
// Runs on rank 0 only when launched with more ranks; errors throw pipetrain::Error.
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "pipetrain/app/commands.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/io/data_convert.hpp"
#include "pipetrain/io/token_dataset.hpp"

namespace pipetrain {
namespace {

struct DataOptions {
  std::vector<std::string> inputs;
  std::string out;
  std::string dtype;
  int64_t vocab = 0;
  std::string tokenizer = "unknown";
};

void print_written(const TokenFileInfo& info) {
  fmt::print("wrote {}: {} tokens, vocab {} ({}), {}\n", info.path, info.num_tokens,
             info.vocab_size, info.tokenizer, info.dtype);
}

void print_info(const TokenFileInfo& info) {
  fmt::print("{}: tokens {}, vocab_size {}, tokenizer {}, dtype {}\n", info.path, info.num_tokens,
             info.vocab_size > 0 ? std::to_string(info.vocab_size) : std::string("unknown"),
             info.tokenizer.empty() ? std::string("unknown") : info.tokenizer, info.dtype);
}

void add_inputs_and_output(CLI::App* sub, DataOptions& o, const char* what) {
  sub->add_option("inputs", o.inputs, what)->required();
  sub->add_option("-o,--output", o.out, "Token file to write (HDF5, e.g. train.h5)")->required();
}

}  // namespace

void add_data_command(CLI::App& app, CommandRunner& runner) {
  auto* data = app.add_subcommand("data", "Build and inspect HDF5 token datasets");
  data->require_subcommand(1);
  auto o = std::make_shared<DataOptions>();

  auto* text = data->add_subcommand("text", "Byte-level tokenize text files (vocab 256)");
  add_inputs_and_output(text, *o, "Text files, concatenated in order");
  run_on_rank0(text, runner, [o] { print_written(convert_text(o->inputs, o->out)); });

  auto* llmc = data->add_subcommand("llmc", "Import llm.c GPT-2 token shards (.bin)");
  add_inputs_and_output(llmc, *o, "llm.c shards, concatenated in order");
  run_on_rank0(llmc, runner, [o] { print_written(convert_llmc(o->inputs, o->out)); });

  auto* raw = data->add_subcommand("raw", "Import headerless little-endian token arrays");
  add_inputs_and_output(raw, *o, "Raw token files, concatenated in order");
  raw->add_option("--dtype", o->dtype, "Token type in the files: u16 or u32")->required();
  raw->add_option("--vocab", o->vocab, "Vocabulary size (every token must be below it)")
      ->required();
  raw->add_option("--tokenizer", o->tokenizer, "Tokenizer name to record")->capture_default_str();
  run_on_rank0(raw, runner, [o] {
    print_written(convert_raw(o->inputs, o->out, o->dtype, o->vocab, o->tokenizer));
  });

  auto* info = data->add_subcommand("info", "Print what token files hold");
  info->add_option("files", o->inputs, "Token files (.h5)")->required();
  run_on_rank0(info, runner, [o] {
    for (const auto& f : o->inputs) print_info(inspect_token_file(f));
  });
}

}  // namespace pipetrain
