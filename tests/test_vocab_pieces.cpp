// Vocabulary parallelism in the lowered program (pipetrain/schedule/vocab_pieces.hpp):
// delay_backwards keeps every schedule valid with one more stash per rank; every built-in
// over a sweep places its slices and collectives into a program that validates; broken
// vocabulary programs are refused naming rank, position and instruction (or the
// collective a deadlocked rank waits for); and where the output layer outweighs a stage,
// spreading it over every rank shortens the simulated step to near the balanced bound.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <string>

#include "pipetrain/core/error.hpp"
#include "pipetrain/schedule/program.hpp"
#include "pipetrain/schedule/registry.hpp"
#include "pipetrain/schedule/render.hpp"
#include "pipetrain/schedule/simulate.hpp"
#include "pipetrain/schedule/validate.hpp"
#include "pipetrain/schedule/vocab_pieces.hpp"
#include "schedule_sweep.hpp"

namespace pipetrain {
namespace {

using testing::problem;

#define EXPECT_HAS(text, needle) EXPECT_NE((text).find(needle), std::string::npos) << (text)

Costs vocab_costs(double of = 1, double ob = 1) {
  Costs c;
  c.vocab = {0.05, of, ob, 0.05};
  return c;
}

std::string names(const std::vector<Action>& actions) {
  std::vector<std::string> cells;
  for (const Action& a : actions) cells.push_back(to_string(a));
  return fmt::format("{}", fmt::join(cells, " "));
}

TEST(VocabPieces, DelayingBackwardsAddsOneStashPerRank) {
  const Schedule s = make_schedule("1f1b", {2, 1, 4});
  const Schedule d = delay_backwards(s);
  EXPECT_EQ(names(d.per_rank[1]), "1F0 1F1 1B0 1F2 1B1 1F3 1B2 1B3");
  EXPECT_EQ(names(d.per_rank[0]), "0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3");
  ASSERT_NO_THROW(validate(d));
  const std::vector<int> before = simulate(s).peak_inflight, after = simulate(d).peak_inflight;
  for (size_t r = 0; r < before.size(); ++r) EXPECT_EQ(after[r], before[r] + 1) << "rank " << r;
  const Schedule g = make_schedule("gpipe", {2, 1, 4});
  EXPECT_EQ(delay_backwards(g).per_rank, g.per_rank) << "no forward follows GPipe's backwards";
}

TEST(VocabPieces, EveryBuiltinOverASweepPlacesItsSlicesIntoAValidProgram) {
  int cases = 0;
  const int placed = testing::for_each_builtin([&cases](const Schedule& s, int p, int m) {
    // Slices much shorter and much longer than a stage's action, in turns over the sweep.
    const double of = ++cases % 2 ? 0.2 : 3.0;
    Program prog;
    ASSERT_NO_THROW(prog = lower_vocab_parallel(s, {}, vocab_costs(of, of)));
    EXPECT_EQ(problem(prog), "(valid)");
    ASSERT_NO_THROW(simulate_program(prog, vocab_costs(of, of)));
    const Program eval = lower_vocab_parallel(forward_only_schedule(s.stage_to_rank, p, m), {}, vocab_costs());
    EXPECT_EQ(problem(eval), "(valid)") << "forward only";
  });
  EXPECT_GT(placed, 140);
}

// The instruction's index in a rank's list.
size_t find(const Program& p, int rank, const std::string& name) {
  const auto& list = p.per_rank[static_cast<size_t>(rank)];
  for (size_t i = 0; i < list.size(); ++i)
    if (to_string(list[i]) == name) return i;
  ADD_FAILURE() << name << " is not on rank " << rank;
  return 0;
}

TEST(VocabPieces, BrokenVocabularyProgramsAreRefused) {
  const Program good = lower_vocab_parallel(make_schedule("1f1b", {2, 1, 4}), {}, vocab_costs());
  ASSERT_EQ(problem(good), "(valid)");
  {  // two slices with their collectives swapped on one rank: valid there, another order
    Program p = good;
    auto& list = p.per_rank[1];
    const size_t ef1 = find(p, 1, "EF1");
    const std::vector<Instr> block(list.begin() + static_cast<long>(ef1), list.begin() + static_cast<long>(ef1) + 2);
    list.erase(list.begin() + static_cast<long>(ef1), list.begin() + static_cast<long>(ef1) + 2);
    list.insert(list.begin() + static_cast<long>(find(p, 1, "EF0")), block.begin(), block.end());
    EXPECT_HAS(problem(p), "rank 1 posts REDUCE_E1 as its collective 1, but rank 0 posts REDUCE_E0");
  }
  {  // OB before OF: its statistics cannot be posted yet
    Program p = good;
    auto& list = p.per_rank[0];
    std::swap(list[find(p, 0, "OF2")], list[find(p, 0, "OB2")]);
    EXPECT_HAS(problem(p), "(OB2): ALLGATHER_S2 is not posted before it");
  }
  {  // the reduction posted before the slice whose data it carries
    Program p = good;
    auto& list = p.per_rank[0];
    std::swap(list[find(p, 0, "OF1")], list[find(p, 0, "REDUCE_DX1")]);
    EXPECT_HAS(problem(p), "(REDUCE_DX1): posted before OF1, whose data it carries");
  }
  {  // a slice dropped on one rank
    Program p = good;
    auto& list = p.per_rank[1];
    list.erase(list.begin() + static_cast<long>(find(p, 1, "EB3")));
    EXPECT_HAS(problem(p), "rank 1: EB3 never runs");
  }
  {  // the last stage's backward moved before the gradient it needs: posted too late here
    Program p = good;
    auto& list = p.per_rank[1];
    const size_t b = find(p, 1, "1B0");
    const Instr back = list[b];
    list.erase(list.begin() + static_cast<long>(b));
    list.insert(list.begin() + static_cast<long>(find(p, 1, "OF0")), back);
    EXPECT_HAS(problem(p), "(1B0): REDUCE_DX0 is not posted before it");
  }
  {  // rank 0's first backward moved before its OF0: a cycle through the reduction
    Program p = good;
    auto& list = p.per_rank[0];
    const size_t b = find(p, 0, "0B0");
    const Instr back = list[b];
    list.erase(list.begin() + static_cast<long>(b));
    list.insert(list.begin() + static_cast<long>(find(p, 0, "0SEND_F1")) + 1, back);
    const std::string msg = problem(p);
    EXPECT_HAS(msg, "deadlock: rank 0 waits at 0B0");
    EXPECT_HAS(msg, "for the gradient 1SEND_B0 (rank 1); rank 1 waits at 1B0");
    EXPECT_HAS(msg, "for REDUCE_DX0, not yet posted by rank 0");
  }
  Program plain = lower(make_schedule("1f1b", {2, 1, 4}));
  plain.per_rank[0].insert(plain.per_rank[0].begin(), good.per_rank[0][find(good, 0, "EF0")]);
  EXPECT_HAS(problem(plain), "a vocabulary-parallel instruction in a program without vocabulary parallelism");
  EXPECT_THROW(validate_in_order(good), Error);
}

// Per-stage costs of a pipeline whose last stage also carries an output layer worth
// `head` blocks (and whose first carries an embedding of negligible cost): F one third,
// B two thirds of each stage's F+B, as Costs::from_stage_times.
Costs whole_layer_costs(int stages, double blocks_per_stage, double head) {
  std::vector<double> fb(static_cast<size_t>(stages), 3 * blocks_per_stage);
  fb.back() += 3 * head;
  return Costs::from_stage_times(fb);
}

TEST(VocabPieces, SpreadingTheOutputLayerBalancesWhatNoSplitOfBlocksCan) {
  // GPT-2 small's proportions at pp = 4: 12 blocks, a head worth about 5. Today's whole
  // layers put the head on the last stage; with vocabulary parallelism each rank takes a
  // quarter of it (OF two of its three products, OB the weight gradient's).
  const int P = 4, M = 16;
  const double blocks = 12.0 / P, head = 5.0;
  const Schedule s = make_schedule("1f1b", {P, 1, M});
  const double whole = simulate(s, whole_layer_costs(P, blocks, 0.0 + head)).makespan;
  Costs vp = whole_layer_costs(P, blocks, 0.0);
  vp.vocab = {0.0, 2 * head / P, head / P, 0.0};
  const Program prog = lower_vocab_parallel(s, {}, vp);
  ASSERT_EQ(problem(prog), "(valid)");
  const SimResult r = simulate_program(prog, vp);
  if (std::getenv("SHOW")) std::printf("%s", render_text(s, r).c_str());
  // The balanced bound: 1F1B's makespan with every stage carrying blocks + head / P.
  const double balanced = simulate(s, whole_layer_costs(P, blocks + head / P, 0.0)).makespan;
  std::printf("  1f1b pp %d, %d microbatches: whole layers %.1f, vocabulary parallel %.1f, balanced bound %.1f\n", P, M,
              whole, r.makespan, balanced);
  // The imbalance goes (the head stage is 8 block-equivalents against 3 + 1.25): the
  // issue's target, within 1% of the balanced bound (the simulation is exact arithmetic;
  // the placement reaches 0.93 of it, its OBs filling the ramps' idle time).
  EXPECT_LT(r.makespan, 0.6 * whole);
  EXPECT_LT(r.makespan, 1.01 * balanced);
}

}  // namespace
}  // namespace pipetrain
