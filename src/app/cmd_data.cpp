// `pipetrain data`: add_data_command (declared in pipetrain/app/commands.hpp).
//   pipetrain data text IN.txt... -o OUT.h5 [--tokenizer byte|gpt2|PATTERN:RANKS_FILE] [--eot]
//   pipetrain data encode [FILE] [--text S] --tokenizer T [--allow-special]   token ids to stdout
//   pipetrain data decode IDS... --tokenizer T                   text to stdout
//   pipetrain data megatron PREFIX -o OUT.h5 [--vocab N]          Megatron .bin/.idx
//   pipetrain data llmc SHARD.bin... -o OUT.h5                  llm.c GPT-2 shards
//   pipetrain data raw FILE... --dtype u16|u32 --vocab N -o OUT.h5 [--tokenizer NAME]
//   pipetrain data info FILE.h5...                              what a token file holds
// Runs on rank 0 only when launched with more ranks; errors throw pipetrain::Error.
#include <mpi.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/ranges.h>

#include "pipetrain/app/commands.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/io/data_convert.hpp"
#include "pipetrain/io/token_dataset.hpp"
#include "pipetrain/io/tokenizer.hpp"

namespace pipetrain {
namespace {

struct DataOptions {
  std::vector<std::string> inputs;
  std::string out;
  std::string dtype;
  int64_t vocab = 0;
  std::string tokenizer = "unknown";
  std::string text_tokenizer = "byte";
  bool eot = false;
  bool allow_special = false;   // encode: special tokens' text as their ids
  std::string text;             // encode --text
  std::vector<int32_t> ids;     // decode
};

void print_written(const TokenFileInfo& info) {
  fmt::print("wrote {}: {} tokens, vocab {} ({}), {}\n", info.path, info.num_tokens,
             info.vocab_size, info.tokenizer, info.dtype);
}

// Streams the text files through the tokenizer, with a progress line on a terminal and
// the rate at the end.
void tokenize_files(const DataOptions& o) {
  const auto tok = make_tokenizer(o.text_tokenizer);
  const auto t0 = std::chrono::steady_clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  double shown = -1;
  int ranks = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const bool tty = isatty(fileno(stderr)) && rank == 0;
  const TokenFileInfo info = tokenize_text_parallel(MPI_COMM_WORLD, o.inputs, o.out, *tok, o.eot, [&](const TextProgress& p) {
    if (!tty || seconds() - shown < 0.5) return;
    shown = seconds();
    fmt::print(stderr, "\r{:.1f} of {:.1f} MiB, {} tokens, {:.0f} tokens/s   ", p.bytes_done / 1048576.0,
               p.bytes_total / 1048576.0, p.tokens, static_cast<double>(p.tokens) / std::max(shown, 1e-9));
  });
  if (tty) fmt::print(stderr, "\n");
  const double s = seconds();
  if (rank != 0) return;
  print_written(info);
  fmt::print("{} tokens in {:.2f} s: {:.0f} tokens/s ({} tokenizer, {})\n", info.num_tokens, s,
             static_cast<double>(info.num_tokens) / std::max(s, 1e-9), tok->name(),
             ranks == 1 ? std::string("one core") : fmt::format("{} ranks", ranks));
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open", path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
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

  auto* text = data->add_subcommand("text", "Tokenize text files into a token dataset");
  add_inputs_and_output(text, *o, "Text files, concatenated in order");
  text->add_option("--tokenizer", o->text_tokenizer, "byte (vocab 256), gpt2 (GPT-2's BPE), or PATTERN:RANKS_FILE (PATTERN: gpt2, cl100k_base, o200k_base, llama3; a cl100k_base.tiktoken or o200k_base.tiktoken file names its own)")
      ->capture_default_str();
  text->add_flag("--eot", o->eot,
                 "The tokenizer's end-of-text token after each file, ending its document (gpt2, cl100k_base, "
                 "o200k_base: <|endoftext|>; llama3: <|end_of_text|>; byte has none)");
  text->callback([&runner, o] {  // every rank: each tokenizes its slice
    runner = [o] {
      tokenize_files(*o);
      return 0;
    };
  });

  auto* encode = data->add_subcommand("encode", "Print the token ids of a text (a file or --text)");
  encode->add_option("file", o->out, "Text file (UTF-8 for BPE)");
  encode->add_option("--text", o->text, "The text itself");
  encode->add_option("--tokenizer", o->text_tokenizer, "byte, gpt2, or PATTERN:RANKS_FILE")->capture_default_str();
  encode->add_flag("--allow-special", o->allow_special,
                   "A special token's text (<|endoftext|>) gives its id; without it, it is ordinary text");
  run_on_rank0(encode, runner, [o] {
    if (o->out.empty() == o->text.empty()) fail("data encode: give a file or --text, not both");
    const auto tok = make_tokenizer(o->text_tokenizer);
    const std::string text = o->out.empty() ? o->text : read_text(o->out);
    const std::string_view where = o->out.empty() ? std::string_view("--text") : std::string_view(o->out);
    std::vector<int32_t> ids;
    if (o->allow_special)
      encode_with_special(*tok, text, ids, where);
    else
      tok->encode(text, ids, where);
    fmt::print("{}\n", fmt::join(ids, " "));
  });

  auto* decode = data->add_subcommand("decode", "Print the text of token ids");
  decode->add_option("ids", o->ids, "Token ids (read from standard input when none are given)");
  decode->add_option("--tokenizer", o->text_tokenizer, "byte, gpt2, or PATTERN:RANKS_FILE")->capture_default_str();
  run_on_rank0(decode, runner, [o] {
    if (o->ids.empty())
      for (long long id; std::cin >> id;) o->ids.push_back(static_cast<int32_t>(id));
    if (!std::cin.eof() && o->ids.empty()) fail("data decode: standard input holds something other than token ids");
    const std::string text = make_tokenizer(o->text_tokenizer)->decode(o->ids);
    std::fwrite(text.data(), 1, text.size(), stdout);
  });

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

  auto* megatron = data->add_subcommand("megatron", "Convert a Megatron-LM indexed dataset (PREFIX.bin + PREFIX.idx)");
  megatron->add_option("prefix", o->text, "The dataset's prefix (without .bin / .idx)")->required();
  megatron->add_option("-o,--output", o->out, "Token file to write (HDF5)")->required();
  megatron->add_option("--vocab", o->vocab, "Vocabulary size (default: the largest token + 1)");
  megatron->add_option("--tokenizer", o->tokenizer, "Tokenizer name to record")->capture_default_str();
  run_on_rank0(megatron, runner, [o] { print_written(convert_megatron(o->text, o->out, o->vocab, o->tokenizer)); });

  auto* info = data->add_subcommand("info", "Print what token files hold");
  info->add_option("files", o->inputs, "Token files (.h5)")->required();
  run_on_rank0(info, runner, [o] {
    for (const auto& f : o->inputs) print_info(inspect_token_file(f));
  });
}

}  // namespace pipetrain
