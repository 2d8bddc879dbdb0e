// Steps (pipetrain/comm/steps.hpp): a pause deep in nested Steps reaches the driver with
// its request; run() waits at each; two driven in turn interleave at their pauses; a null
// request does not pause; an exception thrown after a pause comes out of step(); a brief
// pause says so. PairTurns (runtime/pair_turns.hpp), the rules by which the executor drives
// an overlapped pair's two Steps, each shown by the choice it changes.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "pipetrain/comm/steps.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/runtime/pair_turns.hpp"

namespace pipetrain {
namespace {

class CountingRequest final : public CommRequest {
 public:
  void wait() override { ++waits; }
  bool test() override { return true; }
  void wait_on(Stream& /*stream*/) override { wait(); }
  int waits = 0;
};

using Log = std::vector<std::string>;

Steps<int> exchange(Log& log, std::string name, CommRequest* r, int value) {
  log.push_back(name + " posts");
  co_await InFlight{r};
  log.push_back(name + " resumes");
  co_return value;
}

// Two exchanges in a row, one level down: the pauses come from the inner Steps.
Steps<int> layer(Log& log, std::string name, CommRequest* r) {
  const int a = co_await exchange(log, name + ".1", r, 1);
  const int b = co_await exchange(log, name + ".2", r, 2);
  co_return 10 * a + b;
}

TEST(Steps, RunAloneWaitsAtEachPause) {
  Log log;
  CountingRequest r;
  EXPECT_EQ(layer(log, "a", &r).run(), 12);
  EXPECT_EQ(r.waits, 2);
  EXPECT_EQ(log, (Log{"a.1 posts", "a.1 resumes", "a.2 posts", "a.2 resumes"}));
}

TEST(Steps, ANestedPauseReachesTheDriverWithItsRequest) {
  Log log;
  CountingRequest r;
  Steps<int> t = layer(log, "a", &r);
  EXPECT_TRUE(log.empty());  // lazy: nothing before the first step
  t.step();
  EXPECT_FALSE(t.done());
  EXPECT_EQ(t.paused_on(), &r);
  EXPECT_EQ(log, (Log{"a.1 posts"}));
  t.step();
  EXPECT_EQ(log.back(), "a.2 posts");
  t.step();
  ASSERT_TRUE(t.done());
  EXPECT_EQ(t.paused_on(), nullptr);
  EXPECT_EQ(t.result(), 12);
}

TEST(Steps, TwoDrivenInTurnInterleaveAtTheirPauses) {
  Log log;
  CountingRequest r;
  Steps<int> a = layer(log, "a", &r), b = layer(log, "b", &r);
  while (!a.done() || !b.done())
    for (Steps<int>* t : {&a, &b})
      if (!t->done()) t->step();
  EXPECT_EQ(log, (Log{"a.1 posts", "b.1 posts", "a.1 resumes", "a.2 posts", "b.1 resumes", "b.2 posts", "a.2 resumes",
                      "b.2 resumes"}));
  EXPECT_EQ(a.result() + b.result(), 24);
}

TEST(Steps, ANullRequestDoesNotPause) {
  Log log;
  Steps<int> t = layer(log, "a", nullptr);
  t.step();
  EXPECT_TRUE(t.done());
  EXPECT_EQ(t.result(), 12);
}

Steps<int> failing(Log& log, CommRequest* r) {
  co_await exchange(log, "f", r, 1);
  fail("after the exchange");
}
Steps<> outer(Log& log, CommRequest* r) {
  co_await failing(log, r);
  log.push_back("not reached");
}

TEST(Steps, AnExceptionAfterAPauseComesOutOfStep) {
  Log log;
  CountingRequest r;
  Steps<> t = outer(log, &r);
  t.step();
  try {
    t.step();
    ADD_FAILURE() << "no exception";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "after the exchange");
  }
  EXPECT_TRUE(t.done());
  EXPECT_EQ(log.back(), "f resumes");
}

Steps<> counts_then_rows(CommRequest* counts, CommRequest* rows) {
  co_await InFlight{counts, true};
  co_await InFlight{rows};
}

TEST(Steps, ABriefPauseSaysSo) {
  CountingRequest counts, rows;
  Steps<> t = counts_then_rows(&counts, &rows);
  EXPECT_FALSE(t.paused_briefly());  // not started
  t.step();
  EXPECT_TRUE(t.paused_briefly());
  t.step();
  EXPECT_FALSE(t.paused_briefly());
  EXPECT_EQ(t.paused_on(), &rows);
  t.step();
  EXPECT_TRUE(t.done());
  EXPECT_FALSE(t.paused_briefly());
}

using Who = PairTurns::Who;
PairSide side(size_t steps, bool in_flight = false) { return {false, in_flight, steps}; }
const PairSide kDone{true, false, 9};

TEST(PairTurns, AnFAndBPairTakesTurnsAndGoesOnWithWhoeverCan) {
  PairTurns t({});
  EXPECT_EQ(t.next(side(0), side(0), true), Who::First);  // the F starts
  t.stepped(Who::First);
  EXPECT_EQ(t.next(side(1, true), side(0), true), Who::Second);
  t.stepped(Who::Second);
  EXPECT_EQ(t.next(side(1), side(1), true), Who::First);         // the other's turn
  EXPECT_EQ(t.next(side(1, true), side(1), true), Who::Second);  // whoever can
  EXPECT_EQ(t.next(side(1, true), side(1, true), true), Who::Neither);
  EXPECT_EQ(t.next(kDone, side(1, true), true), Who::Neither);
  EXPECT_EQ(t.next(kDone, side(1), true), Who::Second);
}

TEST(PairTurns, TheSecondStartsOnceItsInputIsHereOrTheFHasEnded) {
  PairTurns t({});
  t.stepped(Who::First);
  EXPECT_EQ(t.next(side(1, true), side(0), false), Who::Neither);  // its first step would block
  EXPECT_EQ(t.next(side(1), side(0), false), Who::First);
  EXPECT_EQ(t.next(kDone, side(0), false), Who::Second);  // as in order
  t.stepped(Who::Second);
  EXPECT_EQ(t.next(side(2, true), side(1), false), Who::Second);  // started: its input is in
}

TEST(PairTurns, InAnFAndFPairTheFLeads) {
  PairTurns t({true, false, false});
  t.stepped(Who::First);
  EXPECT_EQ(t.next(side(1, true), side(0), true), Who::Second);  // fills the F's wait
  t.stepped(Who::Second);
  EXPECT_EQ(t.next(side(1), side(1), true), Who::First);         // the F's turn again
  EXPECT_EQ(t.next(side(1, true), side(1), true), Who::Second);  // still filling
  PairTurns plain({});
  plain.stepped(Who::Second);
  EXPECT_EQ(plain.next(side(1), side(1), true), Who::First);  // F&B: turns
  plain.stepped(Who::First);
  EXPECT_EQ(plain.next(side(2), side(1), true), Who::Second);
}

TEST(PairTurns, OfOneStageTheSecondNeverGetsAhead) {
  PairTurns t({true, true, false});
  t.stepped(Who::Second);
  EXPECT_EQ(t.next(side(1, true), side(0), true), Who::Second);   // behind: it may go
  EXPECT_EQ(t.next(side(1, true), side(1), true), Who::Neither);  // level: it waits
  EXPECT_EQ(t.next(kDone, side(1), true), Who::Second);           // the F ended
}

TEST(PairTurns, FixedTurnsNeverDependOnTiming) {
  PairTurns t({true, false, true});
  EXPECT_EQ(t.next(side(0), side(0), false), Who::First);
  t.stepped(Who::First);
  EXPECT_EQ(t.next(side(1, true), side(0), false), Who::Second);  // whatever is in flight
  t.stepped(Who::Second);
  EXPECT_EQ(t.next(side(1), side(1, true), true), Who::First);
  t.stepped(Who::First);
  EXPECT_EQ(t.next(kDone, side(1, true), true), Who::Second);
}

}  // namespace
}  // namespace pipetrain
