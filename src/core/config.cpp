// Run configuration: TOML file + `--set section.key=value` overrides -> Config, and back
// (to_toml). Every key is described once in kKeys (config_keys.hpp: section, name, field
// reference); parsing, type checks, unknown-key suggestions and to_toml are all driven by
// that table. The rules between keys are validate_config's (config_validate.cpp).
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

#include "config_keys.hpp"
#include "pipetrain/core/error.hpp"

namespace pipetrain {

using namespace config_keys;

namespace {

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

// store(ctx, key, n, field): TOML node `n` into `field` (full key `key`), checking its type.
template <typename T>
  requires std::is_same_v<T, int> || std::is_same_v<T, uint64_t>
void store(const Ctx& ctx, const std::string& key, const toml::node& n, T* field) {
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
}

void store(const Ctx& ctx, const std::string& key, const toml::node& n, double* field) {
  if (const auto* f = n.as_floating_point())
    *field = f->get();
  else if (const auto* i = n.as_integer())
    *field = static_cast<double>(i->get());
  else
    ctx.type_error(key, "a number", n);
}

void store(const Ctx& ctx, const std::string& key, const toml::node& n, bool* field) {
  if (!n.is_boolean()) ctx.type_error(key, "a boolean (true or false)", n);
  *field = n.as_boolean()->get();
}

void store(const Ctx& ctx, const std::string& key, const toml::node& n, Toggle* field) {
  if (const auto* b = n.as_boolean()) {
    *field = b->get() ? Toggle::On : Toggle::Off;
  } else if (const auto* s = n.as_string(); s && s->get() == "auto") {
    *field = Toggle::Auto;
  } else {
    ctx.type_error(key, "true, false or \"auto\"", n);
  }
}

void store(const Ctx& ctx, const std::string& key, const toml::node& n, std::string* field) {
  if (!n.is_string()) ctx.type_error(key, "a string", n);
  *field = n.as_string()->get();
}

// An array, or the word that means empty (list_word: "auto", "all").
template <typename T>
  requires std::is_same_v<T, int> || std::is_same_v<T, double>
void store(const Ctx& ctx, const std::string& key, const toml::node& n, std::vector<T>* field) {
  constexpr bool ints = std::is_same_v<T, int>;
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
}

// One entry of a blend: { path, weight }.
void store_blend_entry(const Ctx& ctx, const std::string& key, const std::string& at, const toml::table& t,
                       DataConfig* field) {
  for (const auto& [k, v] : t)
    if (k.str() != "path" && k.str() != "weight")
      fail("{}{}.{}: unknown key (a blend entry has path and weight){}", prefix(ctx.source), at, k.str(),
           ctx.note(key));
  const auto* path = t.get("path");
  const auto* weight = t.get("weight");
  if (!path || !path->is_string())
    fail("{}{}.path: a blend entry needs a path (a string){}", prefix(ctx.source), at, ctx.note(key));
  if (!weight || !(weight->is_number()))
    fail("{}{}.weight: a blend entry needs a weight (a number){}", prefix(ctx.source), at, ctx.note(key));
  field->train.push_back(path->as_string()->get());
  field->train_weights.push_back(weight->is_integer() ? static_cast<double>(weight->as_integer()->get())
                                                      : weight->as_floating_point()->get());
}

// data.train: a path, an array of paths, or a blend: an array of {path, weight}.
void store(const Ctx& ctx, const std::string& key, const toml::node& n, DataConfig* field) {
  field->train.clear();
  field->train_weights.clear();
  if (const auto* s = n.as_string()) {
    field->train.push_back(s->get());
    return;
  }
  const auto* a = n.as_array();
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
      ctx.type_error(at,
                     i > 0 && field->train_weights.empty() ? "a string like the entries before it"
                                                           : "a string or { path, weight }",
                     e, key);
    store_blend_entry(ctx, key, at, *t, field);
  }
}

void store(const Ctx& ctx, const std::string& key, const toml::node& n, std::vector<std::string>* field) {
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

// Stores TOML node `n` into the field `ref` (full key `key`), checking its type.
void assign(const Ctx& ctx, const std::string& key, const toml::node& n, Ref ref) {
  std::visit([&](auto* field) { store(ctx, key, n, field); }, ref);
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
          } else if constexpr (std::is_same_v<T, Toggle>) {
            if (*field == Toggle::Auto) section->insert_or_assign(name, "auto");
            else section->insert_or_assign(name, *field == Toggle::On);
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

namespace pipetrain {

ShardLevel shard_level(const ParallelConfig& p) {
  if (p.shard == "weights") return ShardLevel::Weights;
  if (p.shard == "gradients") return ShardLevel::Gradients;
  if (p.shard == "optimizer" || p.zero1) return ShardLevel::Optimizer;
  return ShardLevel::None;
}

ShardSpans shard_spans(const GridShape& g, int shard_group) {
  const int dense = shard_group > 0 ? shard_group : g.replicas();
  return {dense, std::max(1, dense / g.ep)};
}

const char* to_string(ShardLevel level) {
  static const char* names[] = {"none", "optimizer", "gradients", "weights"};
  return names[static_cast<int>(level)];
}

}  // namespace pipetrain
