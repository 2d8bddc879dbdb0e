// Every built-in schedule over a parameter sweep: accepted parameters give a valid
// schedule, the others a clean Error naming the schedule; and the simulated bubble and
// memory properties each schedule promises.
//
// Cost model: F = I = W = 1 and B = I + W = 2 per stage (the zero-bubble paper's
// assumption). For virtual stages the same per-stage costs are used; bubble fractions
// do not change when all costs are scaled, so this equals Megatron's normalisation
// (a virtual stage costs 1/v of a full one).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "pipetrain/core/error.hpp"
#include "pipetrain/schedule/registry.hpp"
#include "pipetrain/schedule/simulate.hpp"
#include "pipetrain/schedule/validate.hpp"

namespace pipetrain {
namespace {

const std::vector<std::string> kNames = {"gpipe", "1f1b",  "interleaved-1f1b", "looped-bfs",
                                         "zb-h1", "zbv",   "dualpipev"};
const std::vector<int> kRanks = {1, 2, 3, 4, 8};

// Each schedule's documented constraints.
bool accepts(const std::string& name, int p, int v, int m) {
  if (name == "gpipe" || name == "1f1b" || name == "zb-h1") return v == 1;
  if (name == "interleaved-1f1b") return m % p == 0;
  if (name == "looped-bfs") return true;
  if (name == "zbv") return v == 2;
  if (name == "dualpipev") return v == 2 && m >= 2 * p;
  return false;
}

TEST(ScheduleBuiltins, SweepValidatesOrRefusesCleanly) {
  int built = 0;
  for (const auto& name : kNames)
    for (int p : kRanks)
      for (int v : {1, 2, 3})
        for (int m = 1; m <= 16; ++m) {
          SCOPED_TRACE(fmt::format("{} ranks={} stages/rank={} microbatches={}", name, p, v, m));
          if (!accepts(name, p, v, m)) {
            try {
              make_schedule(name, {p, v, m});
              ADD_FAILURE() << "accepted parameters it cannot take";
            } catch (const Error& e) {
              EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
            }
            continue;
          }
          const Schedule s = make_schedule(name, {p, v, m});
          EXPECT_EQ(s.name, name);
          EXPECT_EQ(s.num_ranks, p);
          EXPECT_EQ(s.num_stages, p * v);
          EXPECT_EQ(s.num_microbatches, m);
          EXPECT_NO_THROW(validate(s));
          ++built;
        }
  EXPECT_GT(built, 700);
}

TEST(ScheduleBuiltins, ConstraintMessagesSayWhy) {
  auto msg = [](const std::string& name, int p, int v, int m) -> std::string {
    try {
      make_schedule(name, {p, v, m});
    } catch (const Error& e) {
      return e.what();
    }
    return "(accepted)";
  };
  EXPECT_NE(msg("interleaved-1f1b", 4, 2, 6).find("divisible by ranks"), std::string::npos);
  EXPECT_NE(msg("zbv", 4, 3, 8).find("exactly 2 stages per rank"), std::string::npos);
  EXPECT_NE(msg("dualpipev", 4, 2, 7).find("microbatches >= 2 * ranks"), std::string::npos);
  EXPECT_NE(msg("1f1b", 4, 2, 8).find("1 stage per rank"), std::string::npos);
}

double sim_bubble(const std::string& name, int p, int v, int m) {
  return simulate(make_schedule(name, {p, v, m})).bubble_fraction;
}

TEST(ScheduleBubbles, GpipeAnd1f1bMatchClosedForm) {
  for (const char* name : {"gpipe", "1f1b"})
    for (int p : kRanks)
      for (int m = 1; m <= 16; ++m)
        EXPECT_NEAR(sim_bubble(name, p, 1, m), double(p - 1) / (m + p - 1), 1e-12)
            << name << " p=" << p << " m=" << m;
}

TEST(ScheduleBubbles, ClosedFormHoldsForOtherCostRatios) {
  Costs c;
  c.F = 1;
  c.B = 3;
  for (int p : kRanks)
    for (int m : {1, 3, 8, 13}) {
      const double want = double(p - 1) / (m + p - 1);
      EXPECT_NEAR(simulate(make_schedule("1f1b", {p, 1, m}), c).bubble_fraction, want, 1e-12);
      EXPECT_NEAR(simulate(make_schedule("gpipe", {p, 1, m}), c).bubble_fraction, want, 1e-12);
    }
}

// Equal stage times give the defaults' proportions, so the closed form holds; a slower
// stage paces 1f1b: m of its forward + backward plus one pass through the others.
TEST(ScheduleBubbles, CostsFromStageTimes) {
  const Costs c = Costs::from_stage_times({3.0, 6.0});
  ASSERT_EQ(c.per_stage.size(), 2u);
  EXPECT_EQ(c.per_stage[1], (std::array<double, 4>{2.0, 4.0, 2.0, 2.0}));
  EXPECT_NEAR(simulate(make_schedule("1f1b", {2, 1, 4}), Costs::from_stage_times({3.0, 3.0})).bubble_fraction,
              1.0 / 5, 1e-12);
  EXPECT_NEAR(simulate(make_schedule("1f1b", {2, 1, 4}), c).makespan, 4 * 6.0 + 3.0, 1e-12);
}

TEST(ScheduleBubbles, InterleavedMatchesClosedForm) {
  // (p-1) / (v*m + p-1): the 1F1B bubble shrunk v times.
  for (int p : kRanks)
    for (int v : {1, 2, 3})
      for (int m = p; m <= 16; m += p)
        EXPECT_NEAR(sim_bubble("interleaved-1f1b", p, v, m), double(p - 1) / (v * m + p - 1),
                    1e-12)
            << "p=" << p << " v=" << v << " m=" << m;
}

TEST(ScheduleBubbles, ZbH1HasAThirdOf1f1bBubbleTime) {
  // Bubble time per rank = makespan - busy = makespan - 3m. 1F1B: (p-1)(F+B) = 3(p-1);
  // ZB-H1: (p-1)(F+I-W) = p-1 once m >= p.
  for (int p : kRanks)
    for (int m = p; m <= 16; ++m) {
      const double zb = simulate(make_schedule("zb-h1", {p, 1, m})).makespan - 3.0 * m;
      const double f1b = simulate(make_schedule("1f1b", {p, 1, m})).makespan - 3.0 * m;
      EXPECT_DOUBLE_EQ(zb, p - 1.0) << "p=" << p << " m=" << m;
      EXPECT_DOUBLE_EQ(3 * zb, f1b) << "p=" << p << " m=" << m;
    }
  // Below m = p it still beats 1F1B.
  for (int p : kRanks)
    for (int m = 1; m < p; ++m)
      EXPECT_LT(sim_bubble("zb-h1", p, 1, m), sim_bubble("1f1b", p, 1, m));
}

TEST(ScheduleBubbles, VSchedulesBeat1f1bFromTwoMicrobatchesPerRank) {
  for (int p : kRanks) {
    if (p < 2) continue;
    for (int m = 2 * p; m <= 16; ++m) {
      const double f1b = sim_bubble("1f1b", p, 1, m);
      EXPECT_LT(sim_bubble("zbv", p, 2, m), f1b) << "zbv p=" << p << " m=" << m;
      EXPECT_LT(sim_bubble("dualpipev", p, 2, m), f1b) << "dualpipev p=" << p << " m=" << m;
      // Both leave at most p-1 idle units per rank (per-stage units, 6 busy per microbatch).
      EXPECT_LE(simulate(make_schedule("dualpipev", {p, 2, m})).makespan, 6.0 * m + p - 1);
    }
  }
}

TEST(ScheduleMemory, OneFOneBPeakIsMinOfRanksLeftAndMicrobatches) {
  for (int p : kRanks)
    for (int m = 1; m <= 16; ++m) {
      const auto r = simulate(make_schedule("1f1b", {p, 1, m}));
      for (int rank = 0; rank < p; ++rank)
        EXPECT_EQ(r.peak_inflight[static_cast<size_t>(rank)], std::min(p - rank, m))
            << "p=" << p << " m=" << m << " rank=" << rank;
    }
}

TEST(ScheduleMemory, GpipeStashesEveryMicrobatch) {
  const auto r = simulate(make_schedule("gpipe", {4, 1, 9}));
  for (int peak : r.peak_inflight) EXPECT_EQ(peak, 9);
}

TEST(ScheduleMemory, ZbH1PeakIsThe1f1bPeak) {
  // W stays stashed until it runs, so deferring W's raises the later ranks to p; the
  // pipeline's peak (the largest rank's) stays 1F1B's min(p, m).
  for (int p : kRanks)
    for (int m = 1; m <= 16; ++m) {
      const auto zb = simulate(make_schedule("zb-h1", {p, 1, m}));
      const auto f1b = simulate(make_schedule("1f1b", {p, 1, m}));
      const int zb_max = *std::max_element(zb.peak_inflight.begin(), zb.peak_inflight.end());
      const int f1b_max = *std::max_element(f1b.peak_inflight.begin(), f1b.peak_inflight.end());
      EXPECT_LE(zb_max, f1b_max) << "p=" << p << " m=" << m;
      EXPECT_EQ(f1b_max, std::min(p, m));
    }
}

TEST(ScheduleMemory, VSchedulesStashAbout1f1bActivations) {
  // A V-schedule stage holds half a rank's layers: 2p half-size stashes = 1F1B's p.
  for (int p : kRanks)
    for (int m = 1; m <= 16; ++m) {
      for (int peak : simulate(make_schedule("zbv", {p, 2, m})).peak_inflight)
        EXPECT_LE(peak, 2 * std::min(p, m)) << "zbv p=" << p << " m=" << m;
      if (m < 2 * p) continue;
      for (int peak : simulate(make_schedule("dualpipev", {p, 2, m})).peak_inflight)
        EXPECT_LE(peak, 2 * p + 1) << "dualpipev p=" << p << " m=" << m;
    }
}

TEST(ScheduleSimulate, CommunicationLatencyAndBusyTime) {
  Costs c;
  c.comm = 0.5;
  const auto r = simulate(make_schedule("1f1b", {2, 1, 1}), c);
  // 0F0 [0,1], 1F0 [1.5,2.5], 1B0 [2.5,4.5], 0B0 [5,7].
  EXPECT_DOUBLE_EQ(r.makespan, 7.0);
  ASSERT_EQ(r.events.size(), 4u);
  EXPECT_EQ(r.events[2].rank, 1);
  EXPECT_DOUBLE_EQ(r.events[2].start, 1.5);
  EXPECT_DOUBLE_EQ(r.events[3].start, 2.5);
  EXPECT_DOUBLE_EQ(r.events[1].start, 5.0);
  EXPECT_DOUBLE_EQ(r.busy[0], 3.0);
  EXPECT_DOUBLE_EQ(r.busy[1], 3.0);
  EXPECT_NEAR(r.bubble_fraction, 1.0 - 6.0 / 14.0, 1e-12);
}

TEST(ScheduleSimulate, SplitBackwardUsesIAndWCosts) {
  Costs c;
  c.F = 2;
  c.I = 3;
  c.W = 5;
  const auto r = simulate(make_schedule("zb-h1", {1, 1, 2}), c);
  EXPECT_DOUBLE_EQ(r.makespan, 2 * (2 + 3 + 5));
  EXPECT_DOUBLE_EQ(r.bubble_fraction, 0.0);
}

}  // namespace
}  // namespace pipetrain
