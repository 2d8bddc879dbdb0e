// The shard collectives' pass (schedule/shard_pass.hpp): every built-in schedule over a
// sweep, under every placement, gives a program whose collectives validate and simulate;
// the working set follows the reuse policy; the simulator prices the collectives; and
// hand-broken programs (a gather gone, a free too early, a reduce-scatter missing or twice,
// a collective inside an overlapped pair) are refused naming the rank, position and rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "pipetrain/core/error.hpp"
#include "pipetrain/schedule/program_builder.hpp"
#include "pipetrain/schedule/registry.hpp"
#include "pipetrain/schedule/shard_pass.hpp"
#include "pipetrain/schedule/simulate.hpp"
#include "schedule_sweep.hpp"

namespace pipetrain {
namespace {

#define EXPECT_HAS(text, needle) EXPECT_NE((text).find(needle), std::string::npos) << (text)

// uniform_units; with `tied`, the first stage's layer 0 and the last stage's last layer also
// touch the first stage's table unit (k = layers) where one rank holds both.
ShardUnits units_of(const Schedule& s, int layers, bool tied = false) {
  ShardUnits u = uniform_units(s, layers);
  const auto first = static_cast<size_t>(s.stage_to_rank.front());
  if (tied && s.stage_to_rank.back() == s.stage_to_rank.front()) {
    const UnitRef table{0, layers};
    u.layers[first][0][0].push_back(table);
    u.layers[first][s.num_stages - 1][static_cast<size_t>(layers - 1)].push_back(table);
    u.elems[first][table] = 1;
  }
  return u;
}

Program sharded(const Schedule& s, const ShardPlacement& o, int layers = 3, bool tied = false) {
  ProgramRecipe r;
  r.shard = o;
  r.units = units_of(s, layers, tied);
  return build_program(s, r);
}

std::string problem(const Program& p, const Schedule& s, const ShardPlacement& o, int layers = 3) {
  try {
    validate_shards(p, units_of(s, layers), o);
  } catch (const Error& e) {
    return e.what();
  }
  return "(valid)";
}

const std::vector<ShardPlacement> kPlacements = {{false, true, 1, false},
                                                 {true, true, 0, false},
                                                 {true, true, 1, false},
                                                 {true, true, 2, false},
                                                 {true, true, 1, true}};

TEST(ShardPass, EveryBuiltinUnderEveryPlacementValidatesAndSimulates) {
  const int n = testing::for_each_builtin([](const Schedule& s, int, int) {
    for (const ShardPlacement& o : kPlacements)
      for (bool tied : {false, true}) {
        Program p;
        ASSERT_NO_THROW(p = sharded(s, o, 3, tied)) << "prefetch " << o.prefetch << ", keep " << o.keep;
        Costs c;
        c.gather = c.scatter = 0.1;
        ASSERT_NO_THROW(simulate_program(p, c));
        int gathers = 0, scatters = 0;
        for (const auto& list : p.per_rank)
          for (const Instr& in : list) {
            gathers += in.op == InstrOp::Shard && in.shard == ShardOp::GatherW;
            scatters += in.op == InstrOp::Shard && in.shard == ShardOp::ReduceScatterG;
          }
        EXPECT_EQ(gathers > 0, o.weights);
        EXPECT_EQ(scatters, 3 * s.num_stages + (tied && s.stage_to_rank.front() == s.stage_to_rank.back()));
      }
  });
  EXPECT_GT(n, 140);
}

// One rank, one stage of 6 layers, one microbatch: "keep" holds every unit from its first use
// to its last (the forward's to the backward's), "regather" the layer at work, the one
// prefetched and, between the forward and the backward, the last layer run by both.
TEST(ShardPass, TheWorkingSetFollowsTheReusePolicy) {
  const Schedule s = make_schedule("1f1b", {1, 1, 1});
  for (int prefetch : {0, 1, 2}) {
    const Program regather = sharded(s, {true, true, prefetch, false}, 6);
    EXPECT_LE(regather.shard_peak[0].weights, prefetch + 1) << "prefetch " << prefetch;
    const Program keep = sharded(s, {true, true, prefetch, true}, 6);
    EXPECT_EQ(keep.shard_peak[0].weights, 6);
  }
  // The gradient of each unit is open from its backward to its reduce-scatter, right after,
  // and stays (as the copies the reduce-scatter sends) until it ends: kScattersInFlight more
  // at most, and one more while the newest is copied.
  const ShardPeak grads = sharded(s, {false, true, 1, false}, 6).shard_peak[0];
  EXPECT_EQ(grads.gradients, 2 + kScattersInFlight);
  EXPECT_EQ(grads.in_flight, kScattersInFlight + 1);
}

TEST(ShardPass, TheSimulatorPricesTheCollectives) {
  const Schedule s = make_schedule("1f1b", {2, 1, 4});
  const Program p = sharded(s, {true, true, 1, false});
  Costs free_link, slow_link;
  slow_link.gather = slow_link.scatter = 0.5;
  const SimResult a = simulate_program(p, free_link), b = simulate_program(p, slow_link);
  EXPECT_GT(b.makespan, a.makespan);
  EXPECT_FALSE(b.link_events.empty());
  // A gather posted a layer ahead hides behind that layer: a cheap link costs nothing.
  Costs cheap = free_link;
  cheap.gather = 0.1;
  EXPECT_NEAR(simulate_program(sharded(s, {true, false, 1, false}), cheap).makespan, a.makespan, 0.1 + 1e-9);
}

// Breaks rank 0's program of 1f1b on one rank, 3 layers, by `edit`, and returns the refusal.
template <typename Edit>
std::string broken(const ShardPlacement& o, Edit edit) {
  const Schedule s = make_schedule("1f1b", {1, 1, 2});
  Program p = sharded(s, o);
  edit(p.per_rank[0]);
  return problem(p, s, o);
}

auto find_shard(std::vector<Instr>& list, ShardOp op, int nth = 0) {
  return std::find_if(list.begin(), list.end(),
                      [&](const Instr& in) { return in.op == InstrOp::Shard && in.shard == op && nth-- == 0; });
}

TEST(ShardPass, BrokenProgramsAreRefusedNamingTheRule) {
  const ShardPlacement w{true, true, 1, false};
  EXPECT_HAS(broken(w, [](auto& l) { l.erase(find_shard(l, ShardOp::GatherW)); }), "which is not gathered here");
  EXPECT_HAS(broken(w,
                    [](auto& l) {
                      auto last = std::find_if(l.rbegin(), l.rend(), [](const Instr& in) {
                        return in.op == InstrOp::Shard && in.shard == ShardOp::FreeW;
                      });
                      l.erase(std::next(last).base());
                    }),
             "stays gathered at the end");
  EXPECT_HAS(broken(w, [](auto& l) { l.erase(find_shard(l, ShardOp::ReduceScatterG)); }), "is never reduce-scattered");
  EXPECT_HAS(broken(w,
                    [](auto& l) {
                      auto rs = find_shard(l, ShardOp::ReduceScatterG);
                      Instr again = *rs;
                      again.at_layer = -1;
                      l.push_back(again);
                    }),
             "was reduce-scattered already this step");
  // The last layer's unit freed between the forward and the backward that reads it next.
  EXPECT_HAS(broken(w,
                    [](auto& l) {
                      Instr free = *find_shard(l, ShardOp::GatherW);
                      free.shard = ShardOp::FreeW;
                      free.unit = 2;
                      free.at_layer = -1;
                      const auto b = std::find_if(l.begin(), l.end(), [](const Instr& in) {
                        return in.op == InstrOp::Compute && in.action.op == Op::B;
                      });
                      l.insert(b, free);
                    }),
             "which is not gathered here (freed at position");
  // A gradient written after its reduce-scatter: the reduce-scatter of the second microbatch's
  // unit moved before the first backward.
  EXPECT_HAS(broken({false, true, 1, false},
                    [](auto& l) {
                      auto rs = find_shard(l, ShardOp::ReduceScatterG);
                      Instr early = *rs;
                      l.erase(rs);
                      early.at_layer = -1;
                      l.insert(l.begin(), early);
                    }),
             "no work wrote the gradient");
  // An instruction of a compute's layer moved to the front, before any compute.
  EXPECT_HAS(broken(w,
                    [](auto& l) {
                      auto in = std::find_if(l.begin(), l.end(), [](const Instr& i) { return i.at_layer >= 0; });
                      Instr moved = *in;
                      l.erase(in);
                      l.insert(l.begin(), moved);
                    }),
             "runs inside a compute, but no compute comes right before it");
  // The last one moved to a layer its compute does not run.
  EXPECT_HAS(broken(w,
                    [](auto& l) {
                      auto in = std::find_if(l.rbegin(), l.rend(), [](const Instr& i) { return i.at_layer >= 0; });
                      in->at_layer = 7;
                    }),
             "does not run at that point");
}

TEST(ShardPass, NoCollectiveStandsInsideAnOverlappedPair) {
  // dualpipev's F&B pairs: the pass puts the pair's collectives before and after it.
  const Schedule s = make_schedule("dualpipev", {2, 2, 8});
  const ShardPlacement o{true, true, 1, false};
  Program p = sharded(s, o);
  ASSERT_EQ(problem(p, s, o), "(valid)");
  // Moving a collective into a pair is refused.
  auto& list = p.per_rank[0];
  const auto f = std::find_if(list.begin(), list.end(), [](const Instr& in) { return in.overlaps_next; });
  ASSERT_NE(f, list.end());
  Instr gather;
  gather.op = InstrOp::Shard;
  gather.shard = ShardOp::GatherW;
  gather.stage = f->action.stage;
  gather.unit = 0;
  gather.at_layer = 0;
  list.insert(f + 1, gather);
  EXPECT_HAS(problem(p, s, o), "stands inside an overlapped pair");
}

}  // namespace
}  // namespace pipetrain
