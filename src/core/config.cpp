// Run configuration: TOML file + `--set section.key=value` overrides -> Config.
// Every key is described once in kKeys (section, name, field reference); parsing,
// type checks, unknown-key suggestions and to_toml are all driven by that table.
#include "pipetrain/core/config.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string_view>
#include <toml++/toml.h>
#include <type_traits>
#include <variant>

#include "pipetrain/core/error.hpp"

namespace pipetrain {
namespace {

using Ref = std::variant<int*, uint64_t*, double*, bool*, std::string*, std::vector<std::string>*,
                         std::vector<int>*, std::vector<double>*, DataConfig*>;  // DataConfig*: data.train (paths, or a blend)

struct KeyDesc {
  std::string_view section, name;
  Ref (*ref)(Config&);
  std::string full() const { return fmt::format("{}.{}", section, name); }
};

#define PT_KEY(sec, field) \
  KeyDesc { #sec, #field, [](Config& c) -> Ref { return &c.sec.field; } }
constexpr std::array kKeys{
    PT_KEY(model, arch),          PT_KEY(model, n_layer),          PT_KEY(model, n_head),
    PT_KEY(model, d_model),       PT_KEY(model, vocab_size),       PT_KEY(model, max_seq_len),
    PT_KEY(model, n_kv_head),     PT_KEY(model, ffn_hidden),       PT_KEY(model, multiple_of),
    PT_KEY(model, norm_eps),      PT_KEY(model, rope_theta),       PT_KEY(model, tie_embeddings),
    PT_KEY(parallel, dp),         PT_KEY(parallel, pp),            PT_KEY(parallel, tp),
    PT_KEY(parallel, virtual_stages), PT_KEY(parallel, layers_per_stage), PT_KEY(parallel, zero1),
    PT_KEY(parallel, recompute_stages), PT_KEY(parallel, dp_bucket_mb), PT_KEY(train, recompute),
    PT_KEY(schedule, name),       PT_KEY(schedule, file),          PT_KEY(schedule, placement),
    PT_KEY(train, steps),         PT_KEY(train, global_batch),     PT_KEY(train, microbatches),
    PT_KEY(train, seq_len),       PT_KEY(train, lr),               PT_KEY(train, lr_schedule),
    PT_KEY(train, warmup_steps),  PT_KEY(train, min_lr),           PT_KEY(train, beta1),
    PT_KEY(train, beta2),         PT_KEY(train, eps),              PT_KEY(train, weight_decay),
    PT_KEY(train, decay_2d_only), PT_KEY(train, grad_clip),        PT_KEY(train, seed),
    PT_KEY(train, eval_every),    PT_KEY(train, eval_batches),     PT_KEY(train, precision),
    KeyDesc{"data", "train", [](Config& c) -> Ref { return &c.data; }},          PT_KEY(data, val),               PT_KEY(data, sampling),       PT_KEY(data, respect_documents),
    PT_KEY(checkpoint, dir),      PT_KEY(checkpoint, every),       PT_KEY(checkpoint, keep),
    PT_KEY(log, every),           PT_KEY(log, metrics),            PT_KEY(log, file),
    PT_KEY(log, dir),             PT_KEY(log, peak_flops),       PT_KEY(log, progress),
    PT_KEY(runtime, device),      PT_KEY(runtime, timeout_s),      PT_KEY(runtime, on_nonfinite),
    PT_KEY(comm, p2p),            PT_KEY(comm, progress_us),
};
#undef PT_KEY

// The word an integer-list key takes for its empty value: parallel.layers_per_stage =
// "auto" (balanced by cost), parallel.recompute_stages = "all".
std::string list_word(std::string_view key) { return key == "parallel.layers_per_stage" ? "auto" : "all"; }

const KeyDesc* find_key(std::string_view section, std::string_view name) {
  for (const auto& k : kKeys)
    if (k.section == section && k.name == name) return &k;
  return nullptr;
}

bool is_section(std::string_view s) {
  return std::any_of(kKeys.begin(), kKeys.end(), [&](const KeyDesc& k) { return k.section == s; });
}

// "file: " (or nothing when the config has no source).
std::string prefix(const std::string& source) { return source.empty() ? "" : source + ": "; }

// Optimal-string-alignment edit distance (a transposition counts as one edit).
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

// " (did you mean X?)" for the closest known section or key, or "" when nothing is close.
// `name` is a full key ("model.n_layr") or a top-level name ("modle", "steps").
std::string suggest(std::string_view name, bool top_level) {
  std::vector<std::string> candidates;
  std::string_view last_section;
  for (const auto& k : kKeys) {
    if (top_level && k.section != last_section) candidates.emplace_back(k.section);
    last_section = k.section;
    candidates.push_back(k.full());
  }
  const auto dot = name.find('.');
  const std::string_view bare = dot == std::string_view::npos ? name : name.substr(dot + 1);
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const auto& c : candidates) {
    const auto cdot = c.find('.');
    // The right key name in the wrong section (or at top level) is one edit away.
    size_t d = cdot != std::string::npos && std::string_view(c).substr(cdot + 1) == bare
                   ? 1
                   : edit_distance(name, c);
    if (d < best_d) best_d = d, best = c;
  }
  if (best.empty() || best_d > std::max<size_t>(2, name.size() / 4)) return "";
  return fmt::format(" (did you mean {}?)", best);
}

// A TOML basic string literal: quoted, with escapes, always on one line.
std::string quote(std::string_view s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto u = static_cast<unsigned char>(ch);
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (u < 0x20 || u == 0x7f)
          out += fmt::format("\\u{:04X}", u);
        else
          out += ch;
    }
  }
  return out + "\"";
}

// A double as a TOML float that parses back to exactly the same value.
std::string format_double(double v) {
  std::string s = fmt::format("{}", v);  // shortest round-trip representation
  if (std::isfinite(v) && s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

// What a node holds, for messages: `string "abc"`, `float 2.5`, `table`, ...
std::string describe(const toml::node& n) {
  if (auto* s = n.as_string()) return "string " + quote(s->get());
  if (auto* i = n.as_integer()) return fmt::format("integer {}", i->get());
  if (auto* f = n.as_floating_point()) return "float " + format_double(f->get());
  if (auto* b = n.as_boolean()) return fmt::format("boolean {}", b->get());
  if (n.is_array()) return "an array";
  if (n.is_table()) return "a table";
  if (n.is_date()) return "a date";
  if (n.is_time()) return "a time";
  return "a date-time";
}

struct Ctx {
  std::string source;
  std::map<std::string, std::string> overridden;  // full key -> override text
  std::string note(const std::string& key) const {
    auto it = overridden.find(key);
    return it == overridden.end() ? "" : fmt::format(" (from --set {})", it->second);
  }
  [[noreturn]] void type_error(const std::string& key, std::string_view expected,
                               const toml::node& n, const std::string& note_key = "") const {
    fail("{}{}: expected {}, got {}{}", prefix(source), key, expected, describe(n),
         note(note_key.empty() ? key : note_key));
  }
};

// Stores TOML node `n` into the field `ref` (full key `key`), checking its type.
void assign(const Ctx& ctx, const std::string& key, const toml::node& n, Ref ref) {
  std::visit(
      [&](auto* field) {
        using T = std::remove_pointer_t<decltype(field)>;
        if constexpr (std::is_same_v<T, int> || std::is_same_v<T, uint64_t>) {
          const auto* i = n.as_integer();
          if (!i) ctx.type_error(key, std::is_same_v<T, int> ? "an integer" : "a non-negative integer", n);
          const int64_t v = i->get();
          if constexpr (std::is_same_v<T, int>) {
            if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max())
              fail("{}{}: integer {} is out of range{}", prefix(ctx.source), key, v, ctx.note(key));
          } else if (v < 0) {
            ctx.type_error(key, "a non-negative integer", n);
          }
          *field = static_cast<T>(v);
        } else if constexpr (std::is_same_v<T, double>) {
          if (const auto* f = n.as_floating_point())
            *field = f->get();
          else if (const auto* i = n.as_integer())
            *field = static_cast<double>(i->get());
          else
            ctx.type_error(key, "a number", n);
        } else if constexpr (std::is_same_v<T, bool>) {
          if (!n.is_boolean()) ctx.type_error(key, "a boolean (true or false)", n);
          *field = n.as_boolean()->get();
        } else if constexpr (std::is_same_v<T, std::string>) {
          if (!n.is_string()) ctx.type_error(key, "a string", n);
          *field = n.as_string()->get();
        } else if constexpr (std::is_same_v<T, std::vector<int>> || std::is_same_v<T, std::vector<double>>) {
          // An array, or the word that means empty (list_word: "auto", "all").
          constexpr bool ints = std::is_same_v<T, std::vector<int>>;
          field->clear();
          const std::string word = list_word(key);
          if (const auto* s = n.as_string(); s && s->get() == word) return;
          const auto* a = n.as_array();
          if (!a) ctx.type_error(key, fmt::format("\"{}\" or an array of {}", word, ints ? "integers" : "numbers"), n);
          for (size_t i = 0; i < a->size(); ++i) {
            const toml::node& e = *a->get(i);
            const auto* k = e.as_integer();
            if constexpr (ints) {
              if (!k || k->get() < std::numeric_limits<int>::min() || k->get() > std::numeric_limits<int>::max())
                ctx.type_error(fmt::format("{}[{}]", key, i), "an integer", e, key);
              field->push_back(static_cast<int>(k->get()));
            } else {
              const auto* f = e.as_floating_point();
              if (!k && !f) ctx.type_error(fmt::format("{}[{}]", key, i), "a number", e, key);
              field->push_back(f ? f->get() : static_cast<double>(k->get()));
            }
          }
        } else if constexpr (std::is_same_v<T, DataConfig>) {
          // data.train: a path, an array of paths, or a blend: an array of {path, weight}.
          field->train.clear();
          field->train_weights.clear();
          const auto* a = n.as_array();
          if (const auto* s = n.as_string()) {
            field->train.push_back(s->get());
            return;
          }
          if (!a) ctx.type_error(key, "a string, an array of strings or an array of { path, weight }", n);
          for (size_t i = 0; i < a->size(); ++i) {
            const std::string at = fmt::format("{}[{}]", key, i);
            const toml::node& e = *a->get(i);
            if (const auto* str = e.as_string()) {
              if (!field->train_weights.empty()) ctx.type_error(at, "{ path, weight } like the entries before it", e, key);
              field->train.push_back(str->get());
              continue;
            }
            const auto* t = e.as_table();
            if (!t || (i > 0 && field->train_weights.empty()))
              ctx.type_error(at, i > 0 && field->train_weights.empty() ? "a string like the entries before it" : "a string or { path, weight }", e, key);
            for (const auto& [k, v] : *t)
              if (k.str() != "path" && k.str() != "weight")
                fail("{}{}.{}: unknown key (a blend entry has path and weight){}", prefix(ctx.source), at, k.str(), ctx.note(key));
            const auto* path = t->get("path");
            const auto* weight = t->get("weight");
            if (!path || !path->is_string()) fail("{}{}.path: a blend entry needs a path (a string){}", prefix(ctx.source), at, ctx.note(key));
            if (!weight || !(weight->is_number()))
              fail("{}{}.weight: a blend entry needs a weight (a number){}", prefix(ctx.source), at, ctx.note(key));
            field->train.push_back(path->as_string()->get());
            field->train_weights.push_back(weight->is_integer() ? static_cast<double>(weight->as_integer()->get())
                                                                : weight->as_floating_point()->get());
          }
        } else {
          field->clear();
          if (const auto* s = n.as_string()) {
            field->push_back(s->get());
          } else if (const auto* a = n.as_array()) {
            for (size_t i = 0; i < a->size(); ++i) {
              const auto* e = a->get(i)->as_string();
              if (!e) ctx.type_error(fmt::format("{}[{}]", key, i), "a string", *a->get(i), key);
              field->push_back(e->get());
            }
          } else {
            ctx.type_error(key, "a string or an array of strings", n);
          }
        }
      },
      ref);
}

std::string trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string_view::npos) return "";
  return std::string(s.substr(b, s.find_last_not_of(" \t") - b + 1));
}

// Applies one "section.key=value" override to the parsed document.
// Whether `s` is well-formed UTF-8 (TOML documents must be; a bare --set value is
// stored as a string and written back by to_toml).
bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const int n = c < 0x80 ? 0 : (c >> 5) == 0x6 ? 1 : (c >> 4) == 0xE ? 2 : (c >> 3) == 0x1E ? 3 : -1;
    if (n < 0 || i + static_cast<size_t>(n) >= s.size() + (n == 0)) return false;  // n continuation bytes must follow
    for (int k = 1; k <= n; ++k)
      if ((static_cast<unsigned char>(s[i + static_cast<size_t>(k)]) >> 6) != 0x2) return false;
    // Overlong forms, surrogates and values above U+10FFFF.
    if ((n == 1 && c < 0xC2) || (n == 2 && c == 0xE0 && static_cast<unsigned char>(s[i + 1]) < 0xA0) ||
        (n == 2 && c == 0xED && static_cast<unsigned char>(s[i + 1]) >= 0xA0) ||
        (n == 3 && c == 0xF0 && static_cast<unsigned char>(s[i + 1]) < 0x90) ||
        (n == 3 && (c > 0xF4 || (c == 0xF4 && static_cast<unsigned char>(s[i + 1]) >= 0x90))))
      return false;
    i += static_cast<size_t>(n) + 1;
  }
  return true;
}

void apply_override(toml::table& doc, const std::string& text, Ctx& ctx) {
  if (!valid_utf8(text)) fail("--set {}: not valid UTF-8", text);
  const auto eq = text.find('=');
  const std::string key = trim(std::string_view(text).substr(0, eq));
  const auto dot = key.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot == 0 || dot + 1 == key.size())
    fail("--set {}: malformed override (expected section.key=value)", text);
  const std::string section = key.substr(0, dot), name = key.substr(dot + 1);
  const KeyDesc* desc = find_key(section, name);
  if (!desc) fail("--set {}: {}: unknown key{}", text, key, suggest(key, false));

  const std::string raw = trim(std::string_view(text).substr(eq + 1));
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + raw);
  } catch (const toml::parse_error&) {
    parsed = toml::table{};
  }
  const toml::node* value = parsed.size() == 1 ? parsed.get("v") : nullptr;
  // String-valued keys take the text as written unless it is a TOML string (or list).
  Config scratch;
  const Ref ref = desc->ref(scratch);
  if (value && std::holds_alternative<std::string*>(ref) && !value->is_string()) value = nullptr;
  if (value && (std::holds_alternative<std::vector<std::string>*>(ref) || std::holds_alternative<DataConfig*>(ref)) &&
      !value->is_string() && !value->is_array())
    value = nullptr;

  toml::node* sec = doc.get(section);
  if (!sec) sec = doc.insert(section, toml::table{}).first->second.as_table();
  if (!sec->is_table()) ctx.type_error(section, "a table", *sec);
  if (value)
    sec->as_table()->insert_or_assign(name, *value);
  else
    sec->as_table()->insert_or_assign(name, raw);
  ctx.overridden[key] = text;
}

void check(bool ok, const std::string& pre, const std::string& msg) {
  if (!ok) throw Error(pre + msg);
}

}  // namespace

Config parse_config(const std::string& toml_text, const std::string& origin,
                    const std::vector<std::string>& overrides) {
  Ctx ctx{origin, {}};
  toml::table doc;
  try {
    doc = toml::parse(toml_text, origin);
  } catch (const toml::parse_error& e) {
    std::string what(e.description());
    std::replace(what.begin(), what.end(), '\n', ' ');
    fail("{}:{}:{}: {}", origin, e.source().begin.line, e.source().begin.column, what);
  }
  for (const auto& o : overrides) apply_override(doc, o, ctx);

  Config cfg;
  cfg.source = origin;
  for (const auto& [sec_key, sec_node] : doc) {
    const std::string section(sec_key.str());
    if (!is_section(section))
      fail("{}{}: unknown {}{}", prefix(origin), section, sec_node.is_table() ? "section" : "key",
           suggest(section, true));
    const auto* table = sec_node.as_table();
    if (!table) ctx.type_error(section, "a table", sec_node);
    for (const auto& [key, node] : *table) {
      const std::string full = fmt::format("{}.{}", section, key.str());
      const KeyDesc* desc = find_key(section, key.str());
      if (!desc) fail("{}{}: unknown key{}", prefix(origin), full, suggest(full, false));
      assign(ctx, full, node, desc->ref(cfg));
    }
  }
  validate_config(cfg);
  return cfg;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) fail("{}: cannot open file (it is a directory)", path);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open file ({})", path, std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) fail("{}: cannot read file", path);
  return parse_config(text.str(), path, overrides);
}

void validate_config(const Config& cfg) {
  const std::string pre = prefix(cfg.source);
  Config copy = cfg;
  for (const auto& k : kKeys)
    if (const Ref r = k.ref(copy); const auto* d = std::get_if<double*>(&r))
      check(std::isfinite(**d), pre,
            fmt::format("{}: must be a finite number, got {}", k.full(), format_double(**d)));

  const auto at_least = [&](const char* key, int64_t v, int64_t min) {
    check(v >= min, pre, fmt::format("{} ({}) must be {}", key, v, min == 1 ? "> 0" : fmt::format(">= {}", min)));
  };
  const auto& m = cfg.model;
  check(m.arch == "gpt2" || m.arch == "llama", pre,
        fmt::format("model.arch: unsupported architecture {} (expected \"gpt2\" or \"llama\")", quote(m.arch)));
  at_least("model.n_layer", m.n_layer, 1);
  at_least("model.n_head", m.n_head, 1);
  at_least("model.d_model", m.d_model, 1);
  at_least("model.vocab_size", m.vocab_size, 1);
  at_least("model.max_seq_len", m.max_seq_len, 1);
  check(m.d_model % m.n_head == 0, pre,
        fmt::format("model.d_model ({}) must be divisible by model.n_head ({})", m.d_model, m.n_head));
  if (m.arch == "llama") {
    at_least("model.n_kv_head", m.n_kv_head, 0);
    at_least("model.ffn_hidden", m.ffn_hidden, 0);
    at_least("model.multiple_of", m.multiple_of, 1);
    check(m.n_head % m.kv_heads() == 0, pre,
          fmt::format("model.n_kv_head ({}) must divide model.n_head ({}): each key/value head serves whole "
                      "query heads",
                      m.kv_heads(), m.n_head));
    check((m.d_model / m.n_head) % 2 == 0, pre,
          fmt::format("model.d_model / model.n_head = {} must be even (rotary embeddings turn channel pairs)",
                      m.d_model / m.n_head));
    check(m.norm_eps > 0, pre, fmt::format("model.norm_eps ({}) must be > 0", m.norm_eps));
    check(m.rope_theta > 1, pre, fmt::format("model.rope_theta ({}) must be > 1", m.rope_theta));
  }

  const auto& p = cfg.parallel;
  at_least("parallel.dp", p.dp, 1);
  at_least("parallel.pp", p.pp, 1);
  at_least("parallel.tp", p.tp, 1);
  at_least("parallel.virtual_stages", p.virtual_stages, 1);
  check(p.dp_bucket_mb > 0, pre, fmt::format("parallel.dp_bucket_mb ({}) must be > 0", format_double(p.dp_bucket_mb)));
  check(m.n_head % p.tp == 0, pre,
        fmt::format("parallel.tp ({}) must divide model.n_head ({}): each rank holds whole heads", p.tp, m.n_head));
  if (m.arch == "llama") {
    check(m.kv_heads() % p.tp == 0, pre,
          fmt::format("parallel.tp ({}) must divide model.n_kv_head ({}): each rank holds whole key/value heads",
                      p.tp, m.kv_heads()));
    check(m.ffn() % p.tp == 0, pre,
          fmt::format("parallel.tp ({}) must divide the MLP width ({}, model.ffn_hidden)", p.tp, m.ffn()));
  }
  check(m.padded_vocab() % p.tp == 0, pre,
        fmt::format("parallel.tp ({}) must divide the padded vocabulary ({}, model.vocab_size rounded up to "
                    "a multiple of 128)",
                    p.tp, m.padded_vocab()));
  const int64_t stages = int64_t{p.pp} * p.virtual_stages;
  if (!p.layers_per_stage.empty()) {
    check(static_cast<int64_t>(p.layers_per_stage.size()) == stages, pre,
          fmt::format("parallel.layers_per_stage has {} entries, expected parallel.pp * "
                      "parallel.virtual_stages = {}",
                      p.layers_per_stage.size(), stages));
    double sum = 0;
    for (size_t i = 0; i < p.layers_per_stage.size(); ++i) {
      const double n = p.layers_per_stage[i];
      const bool end = i == 0 || i + 1 == p.layers_per_stage.size();
      check(2 * n == std::floor(2 * n), pre,
            fmt::format("parallel.layers_per_stage[{}] ({}) must be a whole or half number of blocks (x.5 splits a "
                        "block between its attention and its MLP)",
                        i, n));
      check(n >= (end ? 0 : 0.5), pre,
            fmt::format("parallel.layers_per_stage[{}] ({}) must be {}", i, n,
                        end ? ">= 0" : ">= 0.5 (only the first and last stage may hold no block)"));
      sum += n;
    }
    check(sum == m.n_layer, pre,
          fmt::format("parallel.layers_per_stage sums to {}, expected model.n_layer = {}", sum, m.n_layer));
  } else {
    check(stages <= m.n_layer, pre,
          fmt::format("parallel.pp * parallel.virtual_stages = {} stages is more than the "
                      "model.n_layer = {} blocks to split",
                      stages, m.n_layer));
  }
  for (size_t i = 0; i < p.recompute_stages.size(); ++i)
    check(p.recompute_stages[i] >= 0 && p.recompute_stages[i] < stages, pre,
          fmt::format("parallel.recompute_stages[{}] ({}) is not a stage: stages are 0..{}", i, p.recompute_stages[i],
                      stages - 1));
  check(cfg.schedule.placement == "loop" || cfg.schedule.placement == "v" ||
            cfg.schedule.placement.find_first_not_of("0123456789, ") == std::string::npos,
        pre,
        fmt::format("schedule.placement: {} is not \"loop\", \"v\" or a list of ranks like \"0,1,1,0\"",
                    quote(cfg.schedule.placement)));
  check(!cfg.schedule.name.empty() || !cfg.schedule.file.empty(), pre,
        "schedule.name: must not be empty (or set schedule.file)");

  const auto& t = cfg.train;
  at_least("train.steps", t.steps, 0);
  at_least("train.global_batch", t.global_batch, 1);
  at_least("train.microbatches", t.microbatches, 1);
  const int64_t per_step = int64_t{p.dp} * t.microbatches;
  check(t.global_batch % per_step == 0, pre,
        fmt::format("train.global_batch ({}) must be divisible by parallel.dp * train.microbatches ({})",
                    t.global_batch, per_step));
  check(t.seq_len >= 1 && t.seq_len <= m.max_seq_len, pre,
        fmt::format("train.seq_len ({}) must be between 1 and model.max_seq_len ({})", t.seq_len,
                    m.max_seq_len));
  check(t.lr > 0, pre, fmt::format("train.lr ({}) must be > 0", t.lr));
  check(t.recompute == "none" || t.recompute == "selective" || t.recompute == "full", pre,
        fmt::format("train.recompute: unknown mode {} (expected \"none\", \"selective\" or \"full\")",
                    quote(t.recompute)));
  check(t.precision == "fp32" || t.precision == "bf16", pre,
        fmt::format("train.precision: unknown precision {} (expected \"fp32\" or \"bf16\")", quote(t.precision)));
  check(t.lr_schedule == "constant" || t.lr_schedule == "cosine", pre,
        fmt::format("train.lr_schedule: unknown schedule {} (expected \"constant\" or \"cosine\")",
                    quote(t.lr_schedule)));
  at_least("train.warmup_steps", t.warmup_steps, 0);
  check(t.min_lr >= 0 && t.min_lr <= t.lr, pre,
        fmt::format("train.min_lr ({}) must be between 0 and train.lr ({})", t.min_lr, t.lr));
  check(t.beta1 >= 0 && t.beta1 < 1, pre, fmt::format("train.beta1 ({}) must be in [0, 1)", t.beta1));
  check(t.beta2 >= 0 && t.beta2 < 1, pre, fmt::format("train.beta2 ({}) must be in [0, 1)", t.beta2));
  check(t.eps > 0, pre, fmt::format("train.eps ({}) must be > 0", t.eps));
  check(t.weight_decay >= 0, pre, fmt::format("train.weight_decay ({}) must be >= 0", t.weight_decay));
  check(t.grad_clip >= 0, pre, fmt::format("train.grad_clip ({}) must be >= 0 (0 = off)", t.grad_clip));

  at_least("train.eval_every", t.eval_every, 0);
  at_least("train.eval_batches", t.eval_batches, 1);
  const auto& d = cfg.data;
  check(t.eval_every == 0 || !d.val.empty(), pre, "train.eval_every is set but data.val names no validation dataset");
  check(!d.train.empty(), pre, "data.train: no training dataset given");
  check(d.train_weights.empty() || d.train_weights.size() == d.train.size(), pre, "data.train: one weight per source");
  for (size_t i = 0; i < d.train_weights.size(); ++i)
    check(d.train_weights[i] > 0 && std::isfinite(d.train_weights[i]), pre,
          fmt::format("data.train[{}].weight ({}): blend weights must be positive", i, format_double(d.train_weights[i])));
  for (const auto* list : {&d.train, &d.val})
    for (size_t i = 0; i < list->size(); ++i)
      check(!(*list)[i].empty(), pre,
            fmt::format("data.{}[{}]: empty file name", list == &d.train ? "train" : "val", i));
  check(d.sampling == "sequential" || d.sampling == "shuffle", pre,
        fmt::format("data.sampling: unknown mode {} (expected \"sequential\" or \"shuffle\")",
                    quote(d.sampling)));

  at_least("checkpoint.every", cfg.checkpoint.every, 0);
  at_least("checkpoint.keep", cfg.checkpoint.keep, 1);
  at_least("log.every", cfg.log.every, 1);
  check(cfg.runtime.device == "cpu" || cfg.runtime.device == "cuda", pre,
        fmt::format("runtime.device: unknown device {} (expected \"cpu\" or \"cuda\")", quote(cfg.runtime.device)));
  check(cfg.comm.p2p == "auto" || cfg.comm.p2p == "nccl" || cfg.comm.p2p == "mpi", pre,
        fmt::format("comm.p2p: unknown transport {} (expected \"auto\", \"nccl\" or \"mpi\")", quote(cfg.comm.p2p)));
  check(cfg.comm.p2p != "nccl" || cfg.runtime.device == "cuda", pre,
        "comm.p2p = \"nccl\" needs runtime.device = \"cuda\" (CPU runs move host memory with MPI)");
  check(cfg.runtime.timeout_s >= 0, pre,
        fmt::format("runtime.timeout_s ({}) must be >= 0 (0 = no watchdog)", cfg.runtime.timeout_s));
  check(cfg.runtime.on_nonfinite == "stop" || cfg.runtime.on_nonfinite == "skip", pre,
        fmt::format("runtime.on_nonfinite: unknown action {} (expected \"stop\" or \"skip\")",
                    quote(cfg.runtime.on_nonfinite)));
  check(cfg.log.peak_flops >= 0, pre, fmt::format("log.peak_flops ({}) must be >= 0 (0 = unknown)", cfg.log.peak_flops));
}

std::string to_toml(const Config& cfg) {
  Config copy = cfg;
  toml::table doc;
  for (const auto& k : kKeys) {
    auto* section = doc.emplace(k.section, toml::table{}).first->second.as_table();
    const std::string name(k.name);
    std::visit(
        [&](auto* field) {
          using T = std::remove_pointer_t<decltype(field)>;
          if constexpr (std::is_same_v<T, std::vector<int>> || std::is_same_v<T, std::vector<double>>) {
            if (field->empty()) {  // parallel.layers_per_stage = "auto", recompute_stages = "all"
              section->insert_or_assign(name, list_word(k.full()));
              return;
            }
          }
          if constexpr (std::is_same_v<T, DataConfig>) {
            toml::array a;
            for (size_t i = 0; i < field->train.size(); ++i) {
              if (field->train_weights.empty()) {
                a.push_back(field->train[i]);
              } else {
                a.push_back(toml::table{{"path", field->train[i]}, {"weight", field->train_weights[i]}});
              }
            }
            section->insert_or_assign(name, std::move(a));
          } else if constexpr (std::is_same_v<T, std::vector<double>>) {
            toml::array a;  // whole numbers as integers: [9, 3], [8.5, 3.5]
            for (double x : *field) {
              if (x == std::floor(x) && std::abs(x) < 1e15) a.push_back(static_cast<int64_t>(x));
              else a.push_back(x);
            }
            section->insert_or_assign(name, std::move(a));
          } else if constexpr (std::is_same_v<T, std::vector<std::string>> || std::is_same_v<T, std::vector<int>>) {
            toml::array a;
            for (const auto& x : *field) {
              if constexpr (std::is_same_v<T, std::vector<int>>) a.push_back(static_cast<int64_t>(x));
              else a.push_back(x);
            }
            section->insert_or_assign(name, std::move(a));
          } else if constexpr (std::is_same_v<T, int> || std::is_same_v<T, uint64_t>) {
            section->insert_or_assign(name, static_cast<int64_t>(*field));  // parse_config bounds both
          } else {
            section->insert_or_assign(name, *field);
          }
        },
        k.ref(copy));
  }
  // Basic strings on one line (escapes, UTF-8 kept): what the README's examples use.
  std::ostringstream out;
  out << toml::toml_formatter(doc, toml::format_flags::allow_unicode_strings) << '\n';
  return out.str();
}

}  // namespace pipetrain
