// validate(): hand-made broken schedules are rejected with a one-line message naming
// the rank, the action and the problem.
#include <gtest/gtest.h>

#include <string>

#include "pipetrain/core/error.hpp"
#include "pipetrain/schedule/csv.hpp"
#include "pipetrain/schedule/registry.hpp"
#include "pipetrain/schedule/validate.hpp"

namespace pipetrain {
namespace {

std::string problem(const Schedule& s) {
  try {
    validate(s);
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "not one line: " << msg;
    return msg;
  }
  return "(valid)";
}

Schedule csv(const std::string& text, const std::string& placement = "loop") {
  return from_csv(text, "test.csv", placement);
}

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE((haystack).find(needle), std::string::npos) << "message: " << (haystack)

TEST(ScheduleValidate, AcceptsAHandWrittenSchedule) {
  EXPECT_EQ(problem(csv("0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n")), "(valid)");
}

TEST(ScheduleValidate, MissingAction) {
  Schedule s = make_schedule("1f1b", {2, 1, 2});
  s.per_rank[1].pop_back();  // 1B1
  const std::string msg = problem(s);
  EXPECT_HAS(msg, "rank 1");
  EXPECT_HAS(msg, "missing action 1B1");
}

TEST(ScheduleValidate, MissingForward) {
  const std::string msg = problem(csv("0F0,0B0,0B1\n1F0,1B0,1F1,1B1\n"));
  EXPECT_HAS(msg, "rank 0: missing action 0F1");
}

TEST(ScheduleValidate, DuplicateAction) {
  const std::string msg = problem(csv("0F0,0F1,0B0,0B1,0F1\n1F0,1B0,1F1,1B1\n"));
  EXPECT_HAS(msg, "rank 0, step 5: duplicate action 0F1 (already at step 2)");
}

TEST(ScheduleValidate, ActionOnTheWrongRank) {
  const std::string msg = problem(csv("0F0,0F1,0B0,0B1,1F0\n1B0,1F1,1B1\n"));
  EXPECT_HAS(msg, "rank 0, step 5: action 1F0 is on the wrong rank: stage 1 lives on rank 1");
}

TEST(ScheduleValidate, BackwardBeforeForwardOnTheSameRank) {
  const std::string msg = problem(csv("0F0,0F1,0B0,0B1\n1B0,1F0,1F1,1B1\n"));
  EXPECT_HAS(msg, "rank 1, step 1: 1B0 runs before 1F0 (step 2), which it needs");
}

TEST(ScheduleValidate, WeightBeforeInputGradient) {
  const std::string msg = problem(csv("0F0,0W0,0I0\n"));
  EXPECT_HAS(msg, "rank 0, step 2: 0W0 runs before 0I0 (step 3)");
}

TEST(ScheduleValidate, WeightWithoutInputGradient) {
  const std::string msg = problem(csv("0F0,0B0,0W0\n"));
  EXPECT_HAS(msg, "rank 0, step 3: 0W0 without 0I0");
}

TEST(ScheduleValidate, InputGradientWithoutWeight) {
  const std::string msg = problem(csv("0F0,0I0\n"));
  EXPECT_HAS(msg, "0I0 without 0W0");
}

TEST(ScheduleValidate, BothFullAndSplitBackward) {
  const std::string msg = problem(csv("0F0,0I0,0B0,0W0\n"));
  EXPECT_HAS(msg, "0B0 and 0I0 both present");
}

TEST(ScheduleValidate, SameRankStagesOutOfOrder) {
  // One rank holds both stages: the forward of stage 1 needs stage 0's first.
  const std::string msg = problem(csv("1F0,0F0,1B0,0B0\n"));
  EXPECT_HAS(msg, "rank 0, step 1: 1F0 runs before 0F0 (step 2), which it needs (activation)");
}

TEST(ScheduleValidate, CrossRankCycleIsADeadlock) {
  // Rank 0 wants microbatch 0's gradient before sending microbatch 1 forward; rank 1
  // insists on microbatch 1 first.
  const std::string msg = problem(csv("0F0,0B0,0F1,0B1\n1F1,1B1,1F0,1B0\n"));
  EXPECT_HAS(msg, "deadlock: ");
  EXPECT_HAS(msg, "rank 0 waits at 0B0 (position 5, compute step 2) for the gradient 1SEND_B0 (rank 1)");
  EXPECT_HAS(msg, "rank 1 waits at 1F1 (position 3, compute step 1) for the activation 0SEND_F1 (rank 0)");
}

TEST(ScheduleValidate, DeadlockAmongThreeRanksNamesOnlyStuckRanks) {
  Schedule s = make_schedule("1f1b", {3, 1, 3});
  // Rank 2 runs microbatch 2 first; the others are plain 1F1B.
  s.per_rank[2] = {{Op::F, 2, 2}, {Op::B, 2, 2}, {Op::F, 0, 2},
                   {Op::B, 0, 2}, {Op::F, 1, 2}, {Op::B, 1, 2}};
  const std::string msg = problem(s);
  EXPECT_HAS(msg, "deadlock: ");
  EXPECT_HAS(msg, "rank 2 waits at 2F2 (position 3, compute step 1) for the activation 1SEND_F2 (rank 1)");
  EXPECT_HAS(msg, "rank 1 waits at 1B0 (position 11, compute step 3) for the gradient 2SEND_B0 (rank 2)");
}

TEST(ScheduleValidate, ShapeErrors) {
  Schedule s = make_schedule("1f1b", {2, 1, 2});
  Schedule t = s;
  t.stage_to_rank.pop_back();
  EXPECT_HAS(problem(t), "stage_to_rank has 1 entries for 2 stages");
  t = s;
  t.stage_to_rank[1] = 7;
  EXPECT_HAS(problem(t), "stage 1 is placed on rank 7");
  t = s;
  t.per_rank.pop_back();
  EXPECT_HAS(problem(t), "programs for 1 ranks");
  t = s;
  t.per_rank[0][0].stage = 9;
  EXPECT_HAS(problem(t), "rank 0, step 1: action 9F0 names stage 9");
  t = s;
  t.per_rank[1][0].microbatch = 5;
  EXPECT_HAS(problem(t), "rank 1, step 1: action 1F5 names microbatch 5");
  t = s;
  t.num_microbatches = 0;
  EXPECT_HAS(problem(t), "at least one microbatch");
}

}  // namespace
}  // namespace pipetrain
