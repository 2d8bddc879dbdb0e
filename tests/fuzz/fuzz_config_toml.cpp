// Fuzz target: the TOML run configuration (pipetrain/core/config.hpp), through
// parse_config() (what load_config() calls once it has read the file), and the same text
// as a planner cluster file (pipetrain/plan/cluster.hpp, parse_cluster()): a
// pipetrain::Error is expected; when it parses, cluster_to_toml round-trips it.
//
// Input: TOML text, optionally followed by a line "#--set" and then one `--set`
// override per line ("train.lr=3e-4"). A pipetrain::Error is an expected outcome; any
// other exception, a crash or a sanitizer report is a finding. When parsing succeeds:
//  - every override was valid UTF-8 (one that is not must be refused);
//  - validate_config() accepts the result (parse_config already validated it);
//  - to_toml round trip (documented in config.hpp): parse_config(to_toml(cfg)) succeeds
//    and gives the same TOML again.
#include <cstddef>
#include <cstdio>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_common.hpp"
#include "pipetrain/core/config.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/plan/cluster.hpp"

namespace {

using pipetrain_fuzz::require;

constexpr const char* kOverrideMarker = "\n#--set\n";

// Well-formed UTF-8 (no overlong forms, surrogates or code points above U+10FFFF).
bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3, cp = c & 0x07;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;
    for (size_t k = 1; k <= n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n + 1;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::string text = input;
  std::vector<std::string> overrides;
  if (const auto at = input.find(kOverrideMarker); at != std::string::npos) {
    text = input.substr(0, at + 1);
    std::string rest = input.substr(at + std::char_traits<char>::length(kOverrideMarker));
    size_t b = 0;
    while (b <= rest.size() && overrides.size() < 16) {
      const size_t e = std::min(rest.find('\n', b), rest.size());
      if (e > b) overrides.push_back(rest.substr(b, e - b));
      b = e + 1;
    }
  }

  // An override that is not UTF-8 must be refused: a bare value is kept as a string,
  // and to_toml would write it into a document that no longer parses (finding 7).
  bool overrides_utf8 = true;
  for (const auto& o : overrides) overrides_utf8 = overrides_utf8 && valid_utf8(o);

  try {  // as a cluster file
    const pipetrain::ClusterSpec c = pipetrain::parse_cluster(text, "cluster.toml");
    const std::string dump = pipetrain::cluster_to_toml(c);
    std::string again;
    try {
      again = pipetrain::cluster_to_toml(pipetrain::parse_cluster(dump, "cluster.toml"));
    } catch (const pipetrain::Error& e) {
      std::fprintf(stderr, "parse_cluster(cluster_to_toml(c)): %s\n%s\n", e.what(), dump.c_str());
      require(false, "cluster_to_toml writes what parse_cluster reads");
    }
    require(again == dump, "cluster_to_toml round-trips");
  } catch (const pipetrain::Error& e) {
    pipetrain_fuzz::note(std::string("parse_cluster: ") + e.what());
  }

  pipetrain::Config cfg;
  try {
    cfg = pipetrain::parse_config(text, "fuzz.toml", overrides);
  } catch (const pipetrain::Error& e) {
    pipetrain_fuzz::note(std::string("parse_config: ") + e.what());
    return 0;
  }
  require(overrides_utf8, "parse_config refuses an override that is not UTF-8");
  pipetrain_fuzz::note("parse_config: ok (" + std::to_string(overrides.size()) + " overrides)");
  require(cfg.source == "fuzz.toml", "Config.source names the origin");
  try {
    pipetrain::validate_config(cfg);
  } catch (const pipetrain::Error& e) {
    std::fprintf(stderr, "validate_config after parse_config: %s\n", e.what());
    require(false, "validate_config accepts what parse_config returned");
  }

  const std::string dump = pipetrain::to_toml(cfg);
  pipetrain::Config back;
  try {
    back = pipetrain::parse_config(dump, "fuzz.toml");
  } catch (const pipetrain::Error& e) {
    std::fprintf(stderr, "parse_config(to_toml(cfg)) failed: %s\n--- to_toml:\n%s---\n", e.what(),
                 dump.c_str());
    require(false, "to_toml output parses again");
  }
  const std::string again = pipetrain::to_toml(back);
  if (again != dump)
    std::fprintf(stderr, "--- to_toml(cfg):\n%s--- to_toml(parse_config(to_toml(cfg))):\n%s---\n",
                 dump.c_str(), again.c_str());
  require(again == dump, "to_toml round-trips through parse_config");
  return 0;
}
