// Fuzz target: the TOML run configuration (pipetrain/core/config.hpp), through
// parse_config() (what load_config() calls once it has read the file).
//
// Input: TOML text, optionally followed by a line "#--set" and then one `--set`
// override per line ("train.lr=3e-4"). A pipetrain::Error is an expected outcome; any
// other exception, a crash or a sanitizer report is a finding. When parsing succeeds:
//  - validate_config() accepts the result (parse_config already validated it);
//  - to_toml round trip (documented in config.hpp): parse_config(to_toml(cfg)) succeeds
//    and gives the same TOML again.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_common.hpp"
#include "pipetrain/core/config.hpp"
#include "pipetrain/core/error.hpp"

namespace {

using pipetrain_fuzz::require;

constexpr const char* kOverrideMarker = "\n#--set\n";

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

  pipetrain::Config cfg;
  try {
    cfg = pipetrain::parse_config(text, "fuzz.toml", overrides);
  } catch (const pipetrain::Error& e) {
    pipetrain_fuzz::note(std::string("parse_config: ") + e.what());
    return 0;
  }
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
