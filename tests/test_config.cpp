// Tests for src/core/config.cpp: TOML parsing, --set overrides, validation, to_toml.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "pipetrain/core/config.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/core/grid_rules.hpp"

namespace pipetrain {
namespace {

// The smallest valid file: everything else is a default.
const std::string kMinimal = "[data]\ntrain = \"train.h5\"\n";

Config parse(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return parse_config(text, "x.toml", overrides);
}

// The pipetrain::Error message parse() throws ("" and a test failure if none).
std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse(text, overrides);
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "not one line: " << msg;
    return msg;
  }
  ADD_FAILURE() << "no error for:\n" << text;
  return "";
}

std::string error_of_validate(const Config& cfg) {
  try {
    validate_config(cfg);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "validate_config accepted the config";
  return "";
}

void expect_same(const Config& a, const Config& b) {
  EXPECT_EQ(a.model.arch, b.model.arch);
  EXPECT_EQ(a.model.n_layer, b.model.n_layer);
  EXPECT_EQ(a.model.n_head, b.model.n_head);
  EXPECT_EQ(a.model.d_model, b.model.d_model);
  EXPECT_EQ(a.model.vocab_size, b.model.vocab_size);
  EXPECT_EQ(a.model.max_seq_len, b.model.max_seq_len);
  EXPECT_EQ(a.parallel.dp, b.parallel.dp);
  EXPECT_EQ(a.parallel.pp, b.parallel.pp);
  EXPECT_EQ(a.parallel.tp, b.parallel.tp);
  EXPECT_EQ(a.parallel.virtual_stages, b.parallel.virtual_stages);
  EXPECT_EQ(a.schedule.name, b.schedule.name);
  EXPECT_EQ(a.schedule.file, b.schedule.file);
  EXPECT_EQ(a.train.steps, b.train.steps);
  EXPECT_EQ(a.train.global_batch, b.train.global_batch);
  EXPECT_EQ(a.train.microbatches, b.train.microbatches);
  EXPECT_EQ(a.train.seq_len, b.train.seq_len);
  EXPECT_EQ(a.train.lr, b.train.lr);  // exact, not approximate
  EXPECT_EQ(a.train.lr_schedule, b.train.lr_schedule);
  EXPECT_EQ(a.train.warmup_steps, b.train.warmup_steps);
  EXPECT_EQ(a.train.min_lr, b.train.min_lr);
  EXPECT_EQ(a.train.beta1, b.train.beta1);
  EXPECT_EQ(a.train.beta2, b.train.beta2);
  EXPECT_EQ(a.train.eps, b.train.eps);
  EXPECT_EQ(a.train.weight_decay, b.train.weight_decay);
  EXPECT_EQ(a.train.decay_2d_only, b.train.decay_2d_only);
  EXPECT_EQ(a.train.grad_clip, b.train.grad_clip);
  EXPECT_EQ(a.train.seed, b.train.seed);
  EXPECT_EQ(a.data.train, b.data.train);
  EXPECT_EQ(a.data.val, b.data.val);
  EXPECT_EQ(a.data.sampling, b.data.sampling);
  EXPECT_EQ(a.checkpoint.dir, b.checkpoint.dir);
  EXPECT_EQ(a.checkpoint.every, b.checkpoint.every);
  EXPECT_EQ(a.checkpoint.keep, b.checkpoint.keep);
  EXPECT_EQ(a.log.every, b.log.every);
  EXPECT_EQ(a.log.metrics, b.log.metrics);
  EXPECT_EQ(a.log.file, b.log.file);
  EXPECT_EQ(a.runtime.device, b.runtime.device);
  EXPECT_EQ(a.runtime.pack_weights, b.runtime.pack_weights);
  EXPECT_EQ(a.comm.p2p, b.comm.p2p);
  EXPECT_EQ(a.train.recompute, b.train.recompute);
  EXPECT_EQ(a.parallel.recompute_stages, b.parallel.recompute_stages);
}

#define EXPECT_HAS(haystack, needle) EXPECT_NE((haystack).find(needle), std::string::npos) << (haystack)

TEST(ConfigTest, DefaultsFillEverythingNotGiven) {
  const Config c = parse(kMinimal);
  Config want;
  want.data.train = {"train.h5"};
  expect_same(c, want);
  EXPECT_EQ(c.source, "x.toml");
  EXPECT_EQ(c.model.padded_vocab(), 50304);
}

TEST(ConfigTest, ParsesEveryKey) {
  const Config c = parse(R"(
[model]
arch = "gpt2"
n_layer = 6
n_head = 4
d_model = 64
vocab_size = 100
max_seq_len = 32
[parallel]
dp = 2
pp = 3
tp = 4
virtual_stages = 2
[schedule]
name = "zbv"
file = "s.csv"
[train]
steps = 7
global_batch = 12
microbatches = 3
seq_len = 16
lr = 3             # an integer literal is fine for a float
lr_schedule = "constant"
warmup_steps = 2
min_lr = 0.5
beta1 = 0.8
beta2 = 0.99
eps = 1e-6
weight_decay = 0.0
decay_2d_only = false
grad_clip = 0
seed = 9223372036854775807
[data]
train = ["a.h5", "b.h5"]
val = "v.h5"
sampling = "shuffle"
[checkpoint]
dir = "ck"
every = 5
keep = 2
[log]
every = 10
metrics = "m.jsonl"
file = "run.log"
)");
  EXPECT_EQ(c.model.n_layer, 6);
  EXPECT_EQ(c.model.max_seq_len, 32);
  EXPECT_EQ(c.parallel.pp, 3);
  EXPECT_EQ(c.parallel.virtual_stages, 2);
  EXPECT_EQ(c.schedule.file, "s.csv");
  EXPECT_EQ(c.train.lr, 3.0);
  EXPECT_EQ(c.train.eps, 1e-6);
  EXPECT_FALSE(c.train.decay_2d_only);
  EXPECT_EQ(c.train.seed, uint64_t{9223372036854775807ULL});
  EXPECT_EQ(c.data.train, (std::vector<std::string>{"a.h5", "b.h5"}));
  EXPECT_EQ(c.data.val, (std::vector<std::string>{"v.h5"}));
  EXPECT_EQ(c.checkpoint.keep, 2);
  EXPECT_EQ(c.log.file, "run.log");
}

// Model families by registry: each arch finds its family, its traits are the model's
// (GPT-2 ties its table and learns positions; Llama has grouped heads, a gated MLP, experts
// and Hugging Face's format), and an unknown arch is named with every family's.
TEST(ModelFamilies, EachArchFindsItsFamilyAndAnUnknownOneIsNamed) {
  ModelConfig m;
  m.arch = "gpt2";
  EXPECT_EQ(m.family().blocks, BlockKind::Gpt2);
  EXPECT_TRUE(m.family().learned_positions && m.family().always_tied && m.tied());
  EXPECT_FALSE(m.family().rms_norm || m.family().grouped_kv || m.family().experts || m.family().hf_format);
  m.arch = "llama";
  EXPECT_EQ(m.family().blocks, BlockKind::Llama);
  EXPECT_TRUE(m.family().rms_norm && m.family().grouped_kv && m.family().gated_mlp && m.family().experts);
  EXPECT_FALSE(m.tied());
  m.tie_embeddings = true;
  EXPECT_TRUE(m.tied());
  m.arch = "mamba";
  EXPECT_EQ(find_model_family(m.arch), nullptr);
  EXPECT_TRUE(m.tied());  // an unknown arch: only the key, no family's trait
  EXPECT_EQ(model_family_names(), "\"gpt2\" or \"llama\"");
  try {
    (void)m.family();
    FAIL() << "no error for an unknown model.arch";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "model.arch: unsupported architecture \"mamba\" (expected \"gpt2\" or \"llama\")");
  }
}

TEST(ConfigTest, ToTomlRoundTripsExactly) {
  Config c;
  c.model = {"gpt2", 3, 4, 48, 1000, 77};
  c.parallel = {{2, 1, 1}, 3, {1, 1, 1}, true, {0, 2}, 7.5, Toggle::Auto};
  c.train.recompute = "selective";
  c.schedule = {"interleaved-1f1b", "path with \"quotes\" and \\ back\tslash.csv", "0,1,1,0"};
  c.train.steps = 0;
  c.train.global_batch = 40;
  c.train.microbatches = 5;
  c.train.seq_len = 77;
  c.train.lr = 0.1 + 0.2;  // not representable in short decimal
  c.train.lr_schedule = "constant";
  c.train.warmup_steps = 3;
  c.train.min_lr = 1.0 / 3.0 * 0.1;
  c.train.beta1 = 0.0;
  c.train.beta2 = std::nextafter(1.0, 0.0);
  c.train.eps = 1e-300;
  c.train.weight_decay = 2.0;  // whole number: must stay a float
  c.train.decay_2d_only = false;
  c.train.grad_clip = 1e20;
  c.train.seed = 123456789012345ULL;
  c.data = {{"a.h5", "b \u00e9.h5"}, {}, "shuffle", true, false, {}};
  c.checkpoint = {"/tmp/ck", 7, 1};
  c.log = {3, "metrics.jsonl", "", "runs/a", 1.5e14, false};
  c.comm.p2p = "mpi";
  c.source = "x.toml";
  const std::string text = to_toml(c);
  for (const char* s : {"[model]", "[parallel]", "[schedule]", "[train]", "[data]", "[checkpoint]", "[log]",
                        "weight_decay = 2.0", "val = []"})
    EXPECT_HAS(text, s);
  const Config back = parse(text);
  expect_same(back, c);
  EXPECT_EQ(to_toml(back), text);
  // Defaults (plus the one required key) round-trip too.
  const Config d = parse(kMinimal);
  expect_same(parse(to_toml(d)), d);
}

TEST(ConfigTest, BlendsParseRoundTripAndRejectBadWeights) {
  Config c = parse(kMinimal, {"data.train=[{path = \"a.h5\", weight = 0.7}, {path = \"web\", weight = 3}]"});
  EXPECT_EQ(c.data.train, (std::vector<std::string>{"a.h5", "web"}));
  EXPECT_EQ(c.data.train_weights, (std::vector<double>{0.7, 3.0}));
  const std::string text = to_toml(c);
  EXPECT_HAS(text, "path = \"a.h5\"");
  expect_same(parse(text), c);
  EXPECT_EQ(parse(text).data.train_weights, c.data.train_weights);
  // Plain lists stay plain.
  EXPECT_TRUE(parse(kMinimal, {"data.train=[\"a.h5\", \"b.h5\"]"}).data.train_weights.empty());
  EXPECT_HAS(error_of(kMinimal, {"data.train=[{path = \"a.h5\", weight = 0}]"}), "data.train[0].weight (0.0): blend weights must be positive");
  EXPECT_HAS(error_of(kMinimal, {"data.train=[{path = \"a.h5\", weight = -1}]"}), "blend weights must be positive");
  EXPECT_HAS(error_of(kMinimal, {"data.train=[{path = \"a.h5\"}]"}), "data.train[0].weight: a blend entry needs a weight");
  EXPECT_HAS(error_of(kMinimal, {"data.train=[{path = \"a.h5\", weight = 1, w = 2}]"}), "data.train[0].w: unknown key");
  EXPECT_HAS(error_of(kMinimal, {"data.train=[{path = \"a.h5\", weight = 1}, \"b.h5\"]"}), "data.train[1]");
}

TEST(ConfigTest, LoadConfigReadsAFile) {
  const auto dir = std::filesystem::temp_directory_path() / ("pt_config_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = (dir / "run.toml").string();
  std::ofstream(path) << kMinimal << "[train]\nsteps = 3\n";
  const Config c = load_config(path, {"train.steps=4"});
  EXPECT_EQ(c.train.steps, 4);
  EXPECT_EQ(c.source, path);
  std::filesystem::remove_all(dir);
}

// ---- overrides -------------------------------------------------------------------------

TEST(ConfigTestOverride, EveryValueForm) {
  const Config c = parse(kMinimal, {
                                       "train.lr=1e-3",             // float
                                       "train.steps=5",             // integer
                                       "train.beta1 = 0",           // integer into a float, spaces
                                       "train.decay_2d_only=false",  // boolean
                                       "schedule.name=gpipe",       // bare string
                                       "log.metrics=\"m.jsonl\"",   // quoted string
                                       "data.val=v.h5",             // bare string into a list
                                       "data.train=[\"a.h5\",\"b.h5\"]",  // TOML array
                                       "checkpoint.dir=2024-01-01",  // would be a date; taken as text
                                       "model.n_layer=2",            // section absent from the file
                                       "train.seed=42",
                                   });
  EXPECT_EQ(c.train.lr, 1e-3);
  EXPECT_EQ(c.train.steps, 5);
  EXPECT_EQ(c.train.beta1, 0.0);
  EXPECT_FALSE(c.train.decay_2d_only);
  EXPECT_EQ(c.schedule.name, "gpipe");
  EXPECT_EQ(c.log.metrics, "m.jsonl");
  EXPECT_EQ(c.data.val, (std::vector<std::string>{"v.h5"}));
  EXPECT_EQ(c.data.train, (std::vector<std::string>{"a.h5", "b.h5"}));
  EXPECT_EQ(c.checkpoint.dir, "2024-01-01");
  EXPECT_EQ(c.model.n_layer, 2);
  EXPECT_EQ(c.train.seed, 42u);
}

// runtime.pack_weights is true, false or "auto" (the default), in a file, a --set and to_toml.
TEST(ConfigTest, PackWeightsTakesTrueFalseOrAuto) {
  EXPECT_EQ(parse(kMinimal).runtime.pack_weights, Toggle::Auto);
  const std::pair<const char*, Toggle> forms[] = {{"true", Toggle::On}, {"false", Toggle::Off}, {"\"auto\"", Toggle::Auto}};
  for (const auto& [text, want] : forms) {
    const Config c = parse(std::string(kMinimal) + "[runtime]\npack_weights = " + text + "\n");
    EXPECT_EQ(c.runtime.pack_weights, want) << text;
    EXPECT_EQ(parse(to_toml(c)).runtime.pack_weights, want) << to_toml(c);
  }
  EXPECT_EQ(parse(kMinimal, {"runtime.pack_weights=auto"}).runtime.pack_weights, Toggle::Auto);  // bare word
  EXPECT_EQ(parse(kMinimal, {"runtime.pack_weights=false"}).runtime.pack_weights, Toggle::Off);
  for (const char* bad : {"\"yes\"", "1"})
    EXPECT_HAS(error_of(std::string(kMinimal) + "[runtime]\npack_weights = " + bad + "\n"),
               "x.toml: runtime.pack_weights: expected true, false or \"auto\"");
}

TEST(ConfigTestOverride, ProvidesARequiredKeyAndLaterOnesWin) {
  const Config c = parse("", {"data.train=foo.h5", "train.steps=1", "train.steps=2"});
  EXPECT_EQ(c.data.train, (std::vector<std::string>{"foo.h5"}));
  EXPECT_EQ(c.train.steps, 2);
}

TEST(ConfigTestOverride, ValueMayContainEquals) {
  EXPECT_EQ(parse(kMinimal, {"log.file=a=b.log"}).log.file, "a=b.log");
}

TEST(ConfigTestOverride, Malformed) {
  for (const char* bad : {"train.steps", "steps=3", ".steps=3", "train.=3", "=3"}) {
    const std::string e = error_of(kMinimal, {bad});
    EXPECT_HAS(e, bad);
    EXPECT_HAS(e, "malformed override");
  }
}

// Found by fuzzing: a bare value is stored as a string and written back by to_toml,
// which must stay parseable TOML (UTF-8).
TEST(ConfigTestOverride, ValueMustBeUtf8) {
  EXPECT_HAS(error_of(kMinimal, {"log.dir=\xca" "runs"}), "not valid UTF-8");
  EXPECT_HAS(error_of(kMinimal, {"log.dir=\xed\xa0\x80"}), "not valid UTF-8");  // a surrogate
  EXPECT_EQ(parse(kMinimal, {"log.dir=r\xc3\xa9sultats"}).log.dir, "r\xc3\xa9sultats");
  EXPECT_EQ(parse(kMinimal, {"log.dir=\xf0\x9f\x9a\x80"}).log.dir, "\xf0\x9f\x9a\x80");
}

TEST(ConfigTestOverride, UnknownKeyIsAnError) {
  const std::string e = error_of(kMinimal, {"model.n_layr=3"});
  EXPECT_HAS(e, "model.n_layr");
  EXPECT_HAS(e, "unknown key");
  EXPECT_HAS(e, "did you mean model.n_layer?");
  EXPECT_HAS(error_of(kMinimal, {"optim.lr=3"}), "optim.lr");
}

TEST(ConfigTestOverride, WrongTypeNamesKeyAndOverride) {
  const std::string e = error_of(kMinimal, {"train.lr=abc"});
  EXPECT_HAS(e, "x.toml: train.lr: expected a number, got string \"abc\"");
  EXPECT_HAS(e, "train.lr=abc");
  EXPECT_HAS(error_of(kMinimal, {"model.n_layer=2.5"}), "model.n_layer: expected an integer, got float 2.5");
}

// ---- one test per error class ----------------------------------------------------------

TEST(ConfigTestError, UnknownKeySuggestsClosest) {
  EXPECT_EQ(error_of(kMinimal + "[model]\nn_layr = 2\n"),
            "x.toml: model.n_layr: unknown key (did you mean model.n_layer?)");
  // The right name in the wrong section.
  EXPECT_HAS(error_of(kMinimal + "[model]\nsteps = 2\n"), "did you mean train.steps?");
  // Nothing close: no suggestion.
  EXPECT_EQ(error_of(kMinimal + "[model]\nfrobnicate = 2\n"), "x.toml: model.frobnicate: unknown key");
}

TEST(ConfigTestError, UnknownSection) {
  const std::string e = error_of(kMinimal + "[modle]\nn_layer = 2\n");
  EXPECT_EQ(e, "x.toml: modle: unknown section (did you mean model?)");
  EXPECT_HAS(error_of(kMinimal + "[optimizer]\nlr = 2\n"), "optimizer: unknown section");
  EXPECT_HAS(error_of("steps = 3\n" + kMinimal), "steps: unknown key (did you mean train.steps?)");
}

TEST(ConfigTestError, WrongType) {
  EXPECT_EQ(error_of(kMinimal + "[train]\nlr = \"abc\"\n"), "x.toml: train.lr: expected a number, got string \"abc\"");
  EXPECT_HAS(error_of(kMinimal + "[train]\ndecay_2d_only = 1\n"), "train.decay_2d_only: expected a boolean");
  EXPECT_HAS(error_of(kMinimal + "[schedule]\nname = 3\n"), "schedule.name: expected a string, got integer 3");
  EXPECT_HAS(error_of("[data]\ntrain = 3\n"), "data.train: expected a string, an array of strings or an array of { path, weight }");
  EXPECT_HAS(error_of("[data]\ntrain = [\"a\", 3]\n"), "data.train[1]: expected a string like the entries before it, got integer 3");
  EXPECT_HAS(error_of("model = 3\n" + kMinimal), "model: expected a table, got integer 3");
  EXPECT_HAS(error_of(kMinimal + "[train]\nseed = -1\n"), "train.seed: expected a non-negative integer");
  EXPECT_HAS(error_of(kMinimal + "[train]\nsteps = 10000000000\n"), "train.steps: integer 10000000000 is out of range");
}

TEST(ConfigTestError, FloatWhereIntegerExpected) {
  EXPECT_EQ(error_of(kMinimal + "[model]\nn_layer = 2.5\n"),
            "x.toml: model.n_layer: expected an integer, got float 2.5");
  EXPECT_HAS(error_of(kMinimal + "[train]\nseed = 1.0\n"), "train.seed: expected a non-negative integer, got float 1.0");
}

TEST(ConfigTestError, MissingFile) {
  try {
    load_config("/nonexistent/config.toml");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_HAS(std::string(e.what()), "/nonexistent/config.toml: cannot open file");
  }
}

TEST(ConfigTestError, SyntaxErrorHasLineAndColumn) {
  const std::string e = error_of(kMinimal + "[train]\nsteps = = 3\n");
  EXPECT_EQ(e.rfind("x.toml:4:", 0), 0u) << e;
  const std::string dup = error_of(kMinimal + "[train]\nsteps = 1\nsteps = 2\n");
  EXPECT_EQ(dup.rfind("x.toml:5:", 0), 0u) << dup;
}

// Each validation rule: the override that breaks it and the key the message must name.
struct Rule {
  std::vector<std::string> set;
  std::string key;
};

TEST(ConfigTestValidate, EveryRuleNamesItsKey) {
  const std::vector<Rule> rules = {
      {{"model.arch=mamba"}, "model.arch: unsupported architecture \"mamba\" (expected \"gpt2\" or \"llama\")"},
      {{"model.arch=llama", "model.n_kv_head=5"}, "model.n_kv_head (5) must divide model.n_head (12)"},
      {{"model.arch=llama", "model.n_head=16", "model.d_model=48"},
       "model.d_model / model.n_head = 3 must be even (rotary embeddings turn channel pairs)"},
      {{"model.arch=llama", "model.n_kv_head=3", "parallel.tp=2", "model.n_head=6"},
       "parallel.tp (2) must divide model.n_kv_head (3)"},
      {{"model.arch=llama", "model.norm_eps=0"}, "model.norm_eps"},
      {{"model.n_layer=0"}, "model.n_layer"},
      {{"model.n_head=-1"}, "model.n_head"},
      {{"model.d_model=0"}, "model.d_model"},
      {{"model.vocab_size=0"}, "model.vocab_size"},
      {{"model.max_seq_len=0"}, "model.max_seq_len"},
      {{"model.d_model=100"}, "model.d_model (100) must be divisible by model.n_head (12)"},
      {{"parallel.dp=0"}, "parallel.dp"},
      {{"parallel.pp=0"}, "parallel.pp"},
      {{"parallel.tp=0"}, "parallel.tp"},
      {{"parallel.virtual_stages=0"}, "parallel.virtual_stages"},
      {{"schedule.name=\"\""}, "schedule.name"},
      {{"train.steps=-1"}, "train.steps"},
      {{"train.global_batch=0"}, "train.global_batch"},
      {{"train.microbatches=0"}, "train.microbatches"},
      {{"train.global_batch=6", "parallel.dp=2", "train.microbatches=2"},
       "x.toml: train.global_batch (6) must be divisible by parallel.dp * train.microbatches (4)"},
      {{"parallel.vocab_parallel=true", "parallel.pp=5", "model.n_layer=12"},
       "x.toml: parallel.vocab_parallel: pp x tp = 5 slices do not divide the padded vocabulary (50304"},
      {{"parallel.vocab_parallel=true", "runtime.device=\"cuda\""}, "parallel.vocab_parallel runs on CPUs only"},
      {{"parallel.vocab_parallel=true", "comm.p2p=\"nccl\""}, "parallel.vocab_parallel: comm.p2p = \"nccl\""},
      {{"train.seq_len=0"}, "train.seq_len"},
      {{"train.seq_len=2000"}, "train.seq_len (2000) must be between 1 and model.max_seq_len (1024)"},
      {{"train.lr=0"}, "train.lr"},
      {{"train.lr_schedule=linear"}, "train.lr_schedule"},
      {{"train.warmup_steps=-1"}, "train.warmup_steps"},
      {{"train.min_lr=-0.1"}, "train.min_lr"},
      {{"train.min_lr=1"}, "train.min_lr"},
      {{"train.beta1=1"}, "train.beta1"},
      {{"train.beta2=-0.5"}, "train.beta2"},
      {{"train.eps=0"}, "train.eps"},
      {{"train.weight_decay=-1"}, "train.weight_decay"},
      {{"train.grad_clip=-1"}, "train.grad_clip"},
      {{"train.lr=nan"}, "train.lr: must be a finite number, got nan"},
      {{"train.grad_clip=inf"}, "train.grad_clip: must be a finite number"},
      {{"train.eps=-inf"}, "train.eps: must be a finite number"},
      {{"data.train=[]"}, "x.toml: data.train: no training dataset given"},
      {{"data.val=[\"\"]"}, "data.val[0]"},
      {{"data.sampling=random"}, "data.sampling"},
      {{"checkpoint.every=-1"}, "checkpoint.every"},
      {{"checkpoint.keep=0"}, "checkpoint.keep"},
      {{"log.every=0"}, "log.every"},
      {{"train.recompute=some"}, "train.recompute: unknown mode \"some\""},
      {{"parallel.recompute_stages=[0, 5]"}, "parallel.recompute_stages[1] (5) is not a stage: stages are 0..0"},
      {{"parallel.recompute_stages=\"none\""}, "parallel.recompute_stages"},
      {{"comm.p2p=gloo"}, "comm.p2p: unknown transport \"gloo\" (expected \"auto\", \"nccl\" or \"mpi\")"},
      {{"comm.p2p=nccl"}, "comm.p2p = \"nccl\" needs runtime.device = \"cuda\""},
      {{"model.n_experts=4"}, "model.n_experts (4): experts replace Llama's MLPs"},
      {{"model.n_experts=4", "model.arch=llama", "model.top_k=5"},
       "model.top_k (5) must be between 1 and model.n_experts (4)"},
      {{"model.n_experts=4", "model.arch=llama", "model.expert_ffn_hidden=6", "parallel.tp=4"},
       "parallel.tp (4) must divide the experts' width (model.expert_ffn_hidden: 6)"},
      {{"model.router_force_balance=true"}, "model.router_force_balance: the model has no experts to balance"},
      {{"parallel.ep=0"}, "parallel.ep"},
      {{"parallel.ep=2", "parallel.dp=2"}, "parallel.ep (2): the model has no experts to split"},
      {{"parallel.ep=2", "model.arch=llama", "model.n_experts=4"}, "parallel.ep (2) must divide parallel.dp (1)"},
      {{"parallel.ep=2", "model.arch=llama", "model.n_experts=3", "parallel.dp=2"},
       "parallel.ep (2) must divide model.n_experts (3)"},
  };
  for (const auto& r : rules) {
    const std::string e = error_of(kMinimal, r.set);
    EXPECT_HAS(e, r.key) << " for --set " << r.set[0];
    EXPECT_EQ(e.rfind("x.toml: ", 0), 0u) << e;
  }
}

TEST(ConfigTestValidate, EmptyFileNeedsTrainingData) {
  EXPECT_EQ(error_of(""), "x.toml: data.train: no training dataset given");
}

TEST(ConfigTestValidate, DirectCallOnDefaultsAndEdges) {
  Config c;
  EXPECT_EQ(error_of_validate(c), "data.train: no training dataset given");  // no source: no prefix
  c.data.train = {"t.h5"};
  EXPECT_NO_THROW(validate_config(c));
  c.train.min_lr = c.train.lr;  // min_lr == lr is allowed
  c.train.beta1 = 0.0;
  c.train.steps = 0;
  c.train.seq_len = c.model.max_seq_len;
  EXPECT_NO_THROW(validate_config(c));
  c.source = "a/b.toml";
  c.train.beta2 = std::numeric_limits<double>::quiet_NaN();
  EXPECT_HAS(error_of_validate(c), "a/b.toml: train.beta2: must be a finite number");
}

}  // namespace
}  // namespace pipetrain

namespace pipetrain {
namespace {

// parallel.sequence_parallel: "auto" is on wherever tp divides a rank's tokens and off
// elsewhere (never an error); `true` there is a one-line error naming the keys.
TEST(ConfigTestValidate, SequenceParallelAutoStaysOffWhereTpDoesNotDivideTheTokens) {
  Config c;
  c.model.n_head = 12, c.model.d_model = 768, c.model.vocab_size = 50257;
  c.train.seq_len = 1024;
  c.parallel.tp = 3;
  EXPECT_FALSE(sequence_parallel_on(c));
  EXPECT_EQ(sequence_parallel_problem(c), "");
  c.parallel.tp = 2;
  EXPECT_TRUE(sequence_parallel_on(c));
  c.parallel.cp = 2, c.train.seq_len = 12;  // 6 tokens a rank
  EXPECT_TRUE(sequence_parallel_on(c));
  c.parallel.tp = 4;  // 6 tokens over 4 tp ranks
  EXPECT_FALSE(sequence_parallel_on(c));
  c.parallel.sequence_parallel = Toggle::On;
  EXPECT_NE(sequence_parallel_problem(c).find("parallel.tp"), std::string::npos);
  EXPECT_NE(sequence_parallel_problem(c).find("train.seq_len"), std::string::npos);
  c.parallel.sequence_parallel = Toggle::Off;
  EXPECT_FALSE(sequence_parallel_on(c));
}

}  // namespace
}  // namespace pipetrain
