// Schedule IR helpers and the schedule registry: op_char/to_string, loop and V
// placements, register_schedule/make_schedule/list_schedules and their errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>

#include "pipetrain/core/error.hpp"
#include "pipetrain/schedule/registry.hpp"
#include "pipetrain/schedule/schedule.hpp"
#include "pipetrain/schedule/validate.hpp"
#include "test_files.hpp"

namespace pipetrain {
namespace {

using testing::error_of;

TEST(ScheduleIR, ActionStrings) {
  EXPECT_EQ(op_char(Op::F), 'F');
  EXPECT_EQ(op_char(Op::B), 'B');
  EXPECT_EQ(op_char(Op::I), 'I');
  EXPECT_EQ(op_char(Op::W), 'W');
  EXPECT_EQ(to_string(Action{Op::F, 3, 0}), "0F3");
  EXPECT_EQ(to_string(Action{Op::W, 12, 10}), "10W12");
}

TEST(ScheduleIR, Placements) {
  EXPECT_EQ(loop_placement(6, 3), (std::vector<int>{0, 1, 2, 0, 1, 2}));
  EXPECT_EQ(v_placement(6, 3), (std::vector<int>{0, 1, 2, 2, 1, 0}));
  EXPECT_EQ(v_placement(8, 2), (std::vector<int>{0, 1, 1, 0, 0, 1, 1, 0}));
  EXPECT_EQ(loop_placement(1, 1), (std::vector<int>{0}));
  EXPECT_THROW(loop_placement(4, 0), Error);
}

TEST(ScheduleRegistry, ListsBuiltins) {
  std::vector<std::string> names;
  for (const auto& [name, desc] : list_schedules()) {
    names.push_back(name);
    EXPECT_FALSE(desc.empty()) << name;
  }
  for (const char* want :
       {"gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zb-h1", "zbv", "dualpipev"})
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
}

TEST(ScheduleRegistry, UnknownNameListsKnownOnes) {
  const std::string msg = error_of([] { make_schedule("2f2b", {2, 1, 4}); });
  EXPECT_NE(msg.find("unknown schedule '2f2b'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("1f1b"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dualpipev"), std::string::npos) << msg;
}

TEST(ScheduleRegistry, RejectsNonPositiveParameters) {
  EXPECT_NE(error_of([] { make_schedule("1f1b", {0, 1, 4}); }).find("ranks"), std::string::npos);
  EXPECT_NE(error_of([] { make_schedule("1f1b", {2, 0, 4}); }).find("stages per rank"),
            std::string::npos);
  EXPECT_NE(error_of([] { make_schedule("1f1b", {2, 1, 0}); }).find("microbatches"),
            std::string::npos);
}

// A user schedule: a generator function plus one registration line.
Schedule reverse_gpipe(const ScheduleParams& p) {
  Schedule s = make_schedule("gpipe", p);
  s.name = "";
  for (auto& prog : s.per_rank) {
    // Backwards in reverse microbatch order: still valid.
    std::reverse(prog.begin() + p.microbatches, prog.end());
  }
  return s;
}

TEST(ScheduleRegistry, UserScheduleRegistersWithOneLine) {
  register_schedule("test-reverse-gpipe", "GPipe with reversed backward order", reverse_gpipe);
  const Schedule s = make_schedule("test-reverse-gpipe", {3, 1, 4});
  EXPECT_EQ(s.name, "test-reverse-gpipe");  // filled in from the registered name
  EXPECT_NO_THROW(validate(s));
  EXPECT_EQ(to_string(s.per_rank[0][4]), "0B3");
  bool listed = false;
  for (const auto& [name, desc] : list_schedules()) listed |= name == "test-reverse-gpipe";
  EXPECT_TRUE(listed);
  // Registering the same name again replaces the generator.
  register_schedule("test-reverse-gpipe", "plain",
                    [](const ScheduleParams& p) { return make_schedule("gpipe", p); });
  EXPECT_EQ(to_string(make_schedule("test-reverse-gpipe", {3, 1, 4}).per_rank[0][4]), "0B0");
}

}  // namespace
}  // namespace pipetrain
