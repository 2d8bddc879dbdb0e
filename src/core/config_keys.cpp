// The key table's lookups and the formatting helpers (config_keys.hpp).
#include "config_keys.hpp"

#include <algorithm>
#include <cmath>

namespace pipetrain::config_keys {

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

}  // namespace pipetrain::config_keys
