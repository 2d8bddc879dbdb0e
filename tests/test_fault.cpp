// The fault-injection seam: specs parse strictly (errors name the bad part), faults fire
// on the rank and occurrence asked for, and nothing fires when disarmed.
#include <gtest/gtest.h>

#include <new>
#include <string>

#include "pipetrain/core/error.hpp"
#include "pipetrain/core/fault.hpp"

namespace pipetrain {
namespace {

std::string error_of(const std::string& spec) {
  try {
    fault::arm(spec, 0);
  } catch (const Error& e) {
    fault::arm("", 0);
    return e.what();
  }
  fault::arm("", 0);
  return "(no error)";
}

TEST(FaultSeam, MalformedSpecsAreErrors) {
  if (!fault::compiled_in) GTEST_SKIP() << "built with PIPETRAIN_FAULT_INJECTION=OFF";
  EXPECT_NE(error_of("0:forward").find("RANK:POINT:KIND"), std::string::npos);
  EXPECT_NE(error_of("0:nowhere:throw").find("unknown point 'nowhere'"), std::string::npos);
  EXPECT_NE(error_of("0:forward:explode").find("unknown kind 'explode'"), std::string::npos);
  EXPECT_NE(error_of("x:forward:throw").find("rank 'x'"), std::string::npos);
  EXPECT_NE(error_of("0:forward:throw:0").find("counts from 1"), std::string::npos);
}

TEST(FaultSeam, FiresOnTheRankAndOccurrenceAsked) {
  if (!fault::compiled_in) GTEST_SKIP() << "built with PIPETRAIN_FAULT_INJECTION=OFF";
  fault::arm("1:forward:throw", 0);  // another rank: nothing happens here
  EXPECT_NO_THROW(fault::point("forward"));
  fault::arm("0:backward:throw:3,0:eval:oom", 0);
  EXPECT_NO_THROW(fault::point("forward"));
  EXPECT_NO_THROW(fault::point("backward"));
  EXPECT_NO_THROW(fault::point("backward"));
  try {
    fault::point("backward");
    FAIL() << "expected the third backward to throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("injected fault at backward (rank 0, occurrence 3)"), std::string::npos);
  }
  EXPECT_NO_THROW(fault::point("backward"));  // fires once
  EXPECT_THROW(fault::point("eval"), std::bad_alloc);
  fault::arm("", 0);
  EXPECT_NO_THROW(fault::point("eval"));
}

}  // namespace
}  // namespace pipetrain
