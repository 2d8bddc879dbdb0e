// Fuzz target: schedule CSV files (pipetrain/schedule/csv.hpp) and validate().
//
// Input: byte 0 picks the placement (byte % 4: 0 "", 1 "loop", 2 "v", 3 "0,1,1,0"); the
// rest is the CSV text. A pipetrain::Error is an expected outcome; any other exception,
// a crash or a sanitizer report is a finding. When parsing succeeds:
//  - validate() runs (Error or success);
//  - to_csv round trip: parsing the dump with the same placement gives the same schedule
//    (ranks, stages, microbatches, placement, programs) and the same dump again.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_common.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/schedule/csv.hpp"
#include "pipetrain/schedule/validate.hpp"

namespace {

using pipetrain_fuzz::require;

const char* placement_of(uint8_t b) {
  switch (b % 4) {
    case 0: return "";
    case 1: return "loop";
    case 2: return "v";
    default: return "0,1,1,0";
  }
}

bool same(const pipetrain::Schedule& a, const pipetrain::Schedule& b) {
  return a.num_ranks == b.num_ranks && a.num_stages == b.num_stages &&
         a.num_microbatches == b.num_microbatches && a.stage_to_rank == b.stage_to_rank &&
         a.per_rank == b.per_rank && a.name == b.name;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string placement = placement_of(data[0]);
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);

  pipetrain::Schedule s;
  try {
    s = pipetrain::from_csv(text, "fuzz.csv", placement);
  } catch (const pipetrain::Error& e) {
    pipetrain_fuzz::note(std::string("from_csv: ") + e.what());
    return 0;
  }
  require(s.num_ranks >= 1 && static_cast<size_t>(s.num_ranks) == s.per_rank.size(),
          "from_csv: one program per rank");
  require(s.num_stages >= 1 && static_cast<size_t>(s.num_stages) == s.stage_to_rank.size(),
          "from_csv: one placement entry per stage");

  bool valid = true;
  try {
    pipetrain::validate(s);
  } catch (const pipetrain::Error& e) {
    pipetrain_fuzz::note(std::string("validate: ") + e.what());
    valid = false;
  }
  if (valid)
    pipetrain_fuzz::note("valid: " + std::to_string(s.num_ranks) + " ranks, " +
                         std::to_string(s.num_stages) + " stages, " +
                         std::to_string(s.num_microbatches) + " microbatches");

  const std::string dump = pipetrain::to_csv(s);
  pipetrain::Schedule back;
  try {
    back = pipetrain::from_csv(dump, "fuzz.csv", placement);
  } catch (const pipetrain::Error& e) {
    std::fprintf(stderr, "from_csv(to_csv(s)) failed: %s\n", e.what());
    require(false, "to_csv output must parse again");
  }
  require(same(s, back), "from_csv(to_csv(s)) == s");
  require(pipetrain::to_csv(back) == dump, "to_csv is stable");
  if (valid) {
    try {
      pipetrain::validate(back);
    } catch (const pipetrain::Error&) {
      require(false, "the round trip of a valid schedule is valid");
    }
  }
  return 0;
}
