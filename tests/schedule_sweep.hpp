// For the lowering tests: every built-in schedule over a sweep of ranks, virtual stages
// and microbatches (the parameters each takes), and a program's validation error.
#pragma once
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <string>

#include "pipetrain/core/error.hpp"
#include "pipetrain/schedule/program.hpp"
#include "pipetrain/schedule/registry.hpp"

namespace pipetrain::testing {

// validate_program's error, which must be one line, or "(valid)".
inline std::string problem(const Program& p, int tag_ub = 32767) {
  try {
    validate_program(p, tag_ub);
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    return msg;
  }
  return "(valid)";
}

// Calls check(schedule, ranks, microbatches) for each, under a SCOPED_TRACE naming it;
// returns how many there were.
template <typename Check>
int for_each_builtin(Check check, int min_ranks = 1) {
  int n = 0;
  for (const char* name : {"gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zb-h1", "zbv", "dualpipev"})
    for (int p = min_ranks; p <= 4; ++p)
      for (int v : {1, 2})
        for (int m : {1, 2, 4, 5, 8}) {
          Schedule s;
          try {
            s = make_schedule(name, {p, v, m});
          } catch (const Error&) {
            continue;  // parameters the schedule does not take
          }
          SCOPED_TRACE(fmt::format("{} p={} v={} m={}", name, p, v, m));
          check(s, p, m);
          ++n;
        }
  return n;
}

}  // namespace pipetrain::testing
