// Lowering: every built-in schedule over a sweep lowers to a program that validates and
// whose peak stash counts equal the simulator's; hand-broken programs are refused naming
// the rank, the position and the instruction.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>

#include "pipetrain/core/error.hpp"
#include "pipetrain/schedule/csv.hpp"
#include "pipetrain/schedule/program.hpp"
#include "pipetrain/schedule/program_builder.hpp"
#include "pipetrain/schedule/program_csv.hpp"
#include "pipetrain/schedule/registry.hpp"
#include "pipetrain/schedule/simulate.hpp"
#include "pipetrain/schedule/validate.hpp"
#include "pipetrain/schedule/vocab_pieces.hpp"
#include "schedule_sweep.hpp"
#include "test_files.hpp"

namespace pipetrain {
namespace {

using testing::problem;

#define EXPECT_HAS(text, needle) EXPECT_NE((text).find(needle), std::string::npos) << (text)

TEST(Lowering, EveryBuiltinOverASweepValidatesWithTheSimulatorsPeaks) {
  const int lowered = testing::for_each_builtin([](const Schedule& s, int, int) {
    const Program prog = lower(s);
    std::vector<int> peaks;
    ASSERT_NO_THROW(peaks = validate_program(prog, 32767)) << problem(prog);
    EXPECT_EQ(peaks, simulate(s).peak_inflight);
    for (int ahead : {1, 2, 8}) EXPECT_EQ(problem(lower(s, {ahead, 32767})), "(valid)") << "lookahead " << ahead;
  });
  EXPECT_GT(lowered, 140);
}

TEST(Lowering, TransfersAreExplicitAndSameRankHandOffsAreMoves) {
  // zbv on 2 ranks: stages 0 1 | 1 0 (V): 1 -> 2 is on rank 1 itself.
  const Program p = lower(make_schedule("zbv", {2, 2, 2}));
  auto has = [&](int r, const std::string& cell) {
    for (const auto& i : p.per_rank[static_cast<size_t>(r)])
      if (to_string(i) == cell) return true;
    return false;
  };
  EXPECT_TRUE(has(0, "0SEND_F0"));
  EXPECT_TRUE(has(1, "1RECV_F0"));
  EXPECT_TRUE(has(1, "1MOVE_F0"));   // stage 1 -> 2, both on rank 1
  EXPECT_FALSE(has(1, "1SEND_F0"));
  EXPECT_TRUE(has(1, "1SEND_B0"));   // stage 1's input gradient back to stage 0
  EXPECT_TRUE(has(0, "0RECV_B0"));
}

TEST(Lowering, ForwardOnlyProgramsValidate) {
  for (int p : {1, 2, 4}) {
    const Schedule s = forward_only_schedule(loop_placement(2 * p, p), p, 3);
    const Program prog = lower(s);
    EXPECT_FALSE(prog.backward);
    EXPECT_EQ(problem(prog), "(valid)");
    for (const auto& rank : prog.per_rank)
      for (const auto& i : rank)
        if (i.op == InstrOp::Compute) {
          EXPECT_TRUE(i.frees_stash) << to_string(i);
        }
  }
}

// Finds the first instruction printed as `cell` on rank r.
size_t find(const Program& p, int r, const std::string& cell) {
  const auto& v = p.per_rank[static_cast<size_t>(r)];
  for (size_t i = 0; i < v.size(); ++i)
    if (to_string(v[i]) == cell) return i;
  ADD_FAILURE() << cell << " not on rank " << r;
  return 0;
}

TEST(Lowering, BrokenProgramsAreRefusedWithRankAndPosition) {
  const Program good = lower(make_schedule("1f1b", {2, 1, 2}));
  ASSERT_EQ(problem(good), "(valid)");

  Program p = good;  // a receive with no send
  p.per_rank[0].erase(p.per_rank[0].begin() + static_cast<long>(find(p, 0, "0SEND_F1")));
  EXPECT_HAS(problem(p), "rank 0: the activation feeding stage 1 of microbatch 1 is computed but never sent");

  p = good;  // the send of a value nobody receives
  p.per_rank[1].erase(p.per_rank[1].begin() + static_cast<long>(find(p, 1, "1RECV_F1")));
  EXPECT_HAS(problem(p), "rank 1, position");
  EXPECT_HAS(problem(p), "(1F1): no receive of its input from rank 0 is posted before it");

  p = good;  // a receive moved after the compute that needs it
  {
    auto& v = p.per_rank[1];
    const size_t r = find(p, 1, "1RECV_F0"), c = find(p, 1, "1F0");
    std::swap(v[r], v[c]);
  }
  EXPECT_HAS(problem(p), "(1F0): no receive of its input from rank 0 is posted before it");

  p = good;  // a duplicate tag between the same pair of ranks
  p.per_rank[0][find(p, 0, "0SEND_F1")].tag = p.per_rank[0][find(p, 0, "0SEND_F0")].tag;
  EXPECT_HAS(problem(p), "is already used from rank 0 to rank 1");

  p = good;  // a tag above the bound
  EXPECT_HAS(problem(p, 0), "is outside 0..MPI_TAG_UB = 0");

  p = good;  // rank 0 computes its backward before it sends the forward: deadlock
  {
    auto& v = p.per_rank[0];
    const size_t send = find(p, 0, "0SEND_F0");
    const Instr s = v[send];
    v.erase(v.begin() + static_cast<long>(send));
    v.insert(v.begin() + static_cast<long>(find(p, 0, "0B0")) + 1, s);
  }
  EXPECT_HAS(problem(p),
             "deadlock: rank 0 waits at 0B0 (position 6, compute step 3) for the gradient 1SEND_B0 (rank 1); "
             "rank 1 waits at 1F0 (position 3, compute step 1) for the activation 0SEND_F0 (rank 0)");

  p = good;  // a stash freed twice
  p.per_rank[0][find(p, 0, "0F0")].frees_stash = true;
  EXPECT_HAS(problem(p), "(0B0): runs before the forward of its microbatch (or after its free)");
}

// DualPipeV's overlapped pairs: lowered with the F marked, a B or I of the other stage or an
// independent F next, and only the F's output between; each way of breaking a pair is named.
TEST(Lowering, OverlappedPairsAreKeptAndProven) {
  const Schedule s = make_schedule("dualpipev", {2, 2, 4});
  const Program good = lower(s);
  ASSERT_EQ(problem(good), "(valid)");
  size_t pairs = 0;
  for (int r = 0; r < 2; ++r)
    for (size_t i = 0; i < good.per_rank[static_cast<size_t>(r)].size(); ++i)
      pairs += good.per_rank[static_cast<size_t>(r)][i].overlaps_next;
  EXPECT_EQ(pairs, s.pairs[0].size() + s.pairs[1].size());
  // Rank r: 2 (r + 1) F&B in phase 4, 1 - r in phase 5; F&F in the warm-up: rank 0's four
  // forwards two by two, rank 1's 2F0 & 1F1 (1F0 and 2F0 are one microbatch's two stages).
  EXPECT_EQ(pairs, 10u);
  ASSERT_TRUE(good.per_rank[0][find(good, 0, "0F0")].overlaps_next);
  ASSERT_TRUE(good.per_rank[0][find(good, 0, "0F2")].overlaps_next);
  ASSERT_FALSE(good.per_rank[1][find(good, 1, "1F0")].overlaps_next);
  ASSERT_TRUE(good.per_rank[1][find(good, 1, "2F0")].overlaps_next);
  const size_t at = find(good, 0, "0F3");  // rank 0's first pair: 0F3 & 3B1
  ASSERT_TRUE(good.per_rank[0][at].overlaps_next);

  Program p = good;  // a later receive moved inside the pair
  {
    auto& v = p.per_rank[0];
    size_t recv = at + 1;
    while (v[recv].op != InstrOp::Recv) ++recv;
    const Instr r = v[recv];
    v.erase(v.begin() + static_cast<long>(recv));
    v.insert(v.begin() + static_cast<long>(at) + 1, r);
  }
  EXPECT_HAS(problem(p), "stands inside an overlapped pair, where only the F's output may leave");

  p = good;  // a backward first, a W second
  p.per_rank[0][find(p, 0, "3I0")].overlaps_next = true;
  EXPECT_HAS(problem(p), "an overlapped pair is an F, then a B, I or F; here 3I0 and 3W0");

  p = good;  // a pair chained to the next
  p.per_rank[0][find(p, 0, "3B1")].overlaps_next = true;
  EXPECT_HAS(problem(p), "an overlapped pair's second, but marked as the F of another");

  p = good;  // a pair at the end of the list
  p.per_rank[0].back().overlaps_next = true;
  EXPECT_HAS(problem(p), "no compute follows it");

  // From a schedule file: an F paired with a B of its own stage.
  const Schedule same = from_csv("0F0,1F0,1B0,0F1&,0B0,1F1,1B1,0B1\n", "same.csv", "0,0");
  try {
    validate(same);
    ADD_FAILURE() << "a pair within one stage validated";
  } catch (const Error& e) {
    EXPECT_HAS(std::string(e.what()), "an F&B pair's two actions are both of stage 0");
  }
  // Two forwards, the second taking the first's output (lowered with its MOVE between).
  const Schedule chained = from_csv("0F0&,1F0,0F1&,1F1,1B0,0B0,1B1,0B1\n", "chained.csv", "0,0");
  try {
    validate(chained);
    ADD_FAILURE() << "an F&F pair whose second takes the first's output validated";
  } catch (const Error& e) {
    EXPECT_HAS(std::string(e.what()), "an F&F pair's second, 1F0, takes the first's output");
  }
  // Two forwards of one stage are a pair (each microbatch's own input).
  EXPECT_NO_THROW(validate(from_csv("0F0&,0F1,1F0&,1F1,1B0,0B0,1B1,0B1\n", "twin.csv", "0,0")));
  // A pair whose second waits, through the other rank, for the first's output (3F0 needs 2F0,
  // which rank 1 runs after 1F1, which needs 0F1): in order the program runs, but the second
  // may wait for its input before the first's output has left.
  const std::string across = "0F0,0F1&,3F0,3B0,3F1,3B1,0B0,0B1\n1F0,1F1,2F0,2F1,2B0,1B0,2B1,1B1\n";
  std::string unpaired = across;
  unpaired.erase(unpaired.find('&'), 1);
  EXPECT_NO_THROW(validate(from_csv(unpaired, "unpaired.csv", "0,1,1,0")));
  try {
    validate(from_csv(across, "across.csv", "0,1,1,0"));
    ADD_FAILURE() << "a pair whose second needs the first's output through another rank validated";
  } catch (const Error& e) {
    EXPECT_HAS(std::string(e.what()), "an overlapped pair's second needs its F's output first");
  }
}

}  // namespace
}  // namespace pipetrain

namespace pipetrain {
namespace {

std::string placement_of(const Schedule& s) { return fmt::format("{}", fmt::join(s.stage_to_rank, ",")); }

TEST(ProgramCsv, EveryBuiltinRoundTripsUnchanged) {
  int n = 0;
  for (const char* name : {"gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zb-h1", "zbv", "dualpipev"})
    for (int p : {1, 2, 4})
      for (int v : {1, 2})
        for (int m : {1, 4, 8}) {
          Schedule s;
          try {
            s = make_schedule(name, {p, v, m});
          } catch (const Error&) {
            continue;
          }
          SCOPED_TRACE(fmt::format("{} p={} v={} m={}", name, p, v, m));
          const Program lowered = lower(s);
          const std::string text = to_comms_csv(lowered);
          EXPECT_EQ(is_comms_csv(text), p > 1);
          const Program back = program_from_csv(text, "x.csv", placement_of(s), 32767);
          EXPECT_EQ(back.per_rank, lowered.per_rank);
          EXPECT_EQ(to_comms_csv(back), text);
          EXPECT_EQ(compute_only(back).per_rank, s.per_rank);
          ++n;
        }
  EXPECT_GT(n, 60);
}

TEST(ProgramCsv, TransferCellsFollowPyTorch) {
  const std::string text = to_comms_csv(lower(make_schedule("1f1b", {2, 1, 2})));
  EXPECT_HAS(text, "0F0,0SEND_F0");
  EXPECT_HAS(text, "1RECV_F0");
  EXPECT_HAS(text, "1B0,1SEND_B0");
  EXPECT_HAS(text, "0RECV_B0");
}

TEST(ProgramCsv, AFileRunsInItsOwnOrderAndBrokenFilesAreRefused) {
  const Schedule s = make_schedule("1f1b", {2, 1, 2});
  std::string text = to_comms_csv(lower(s));
  // Receives moved to just before their use: still valid, and kept where the file puts them.
  std::string late = "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
                     "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1\n";
  const Program p = program_from_csv(late, "late.csv", "loop", 32767);
  EXPECT_EQ(problem(p), "(valid)");
  EXPECT_EQ(to_comms_csv(p), late);
  // A receive that nobody sends.
  const std::string no_send = "0F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
                              "1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1\n";
  EXPECT_HAS(problem(program_from_csv(no_send, "x.csv", "loop", 32767)),
             "rank 0: the activation feeding stage 1 of microbatch 0 is computed but never sent");
  // A receive after the compute that needs it.
  const std::string misordered = "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
                                 "1F0,1RECV_F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1\n";
  EXPECT_HAS(problem(program_from_csv(misordered, "x.csv", "loop", 32767)),
             "rank 1, position 1 (1F0): no receive of its input from rank 0 is posted before it");
  // A transfer of a value that does not exist.
  const std::string bogus = text.substr(0, text.find('\n')) + ",0SEND_F7\n" + text.substr(text.find('\n') + 1);
  EXPECT_HAS(problem(program_from_csv(bogus, "x.csv", "loop", 32767)), "0SEND_F7");
  EXPECT_THROW(program_from_csv("0F0,0SEND_X0\n", "x.csv", "loop", 32767), Error);
}

TEST(ProgramCsv, PositionsCountTheFilesCellsNotTheImplicitMoves) {
  // V placement: rank 1 holds stages 1 and 2, so its lowered list has MOVEs (1F -> 2F,
  // 2I -> 1I) that the file does not show. Move its receive of 2I0's gradient after 2I0
  // and expect the error at 2I0's column in the edited row.
  const Program lowered = lower(make_schedule("zbv", {2, 2, 2}));
  const std::string text = to_comms_csv(lowered);
  const size_t nl = text.find('\n');
  std::vector<std::string> row;
  for (size_t c = nl + 1; c < text.size() - 1;) {
    const size_t d = std::min(text.find(',', c), text.size() - 1);
    row.push_back(text.substr(c, d - c));
    c = d + 1;
  }
  const auto recv = std::find(row.begin(), row.end(), "2RECV_B0");
  const auto use = std::find(row.begin(), row.end(), "2I0");
  ASSERT_TRUE(recv < use);
  const size_t column = static_cast<size_t>(use - row.begin());  // 1-based, once the receive before it is gone
  std::rotate(recv, recv + 1, use + 1);
  std::string edited = text.substr(0, nl + 1);
  for (size_t c = 0; c < row.size(); ++c) edited += (c ? "," : "") + row[c];
  edited += '\n';
  size_t moves_before = 0;
  for (const Instr& i : lowered.per_rank[1]) {
    if (to_string(i) == "2I0") break;
    moves_before += i.op == InstrOp::Move;
  }
  ASSERT_GT(moves_before, 0u) << "the test needs a MOVE before 2I0";
  EXPECT_HAS(problem(program_from_csv(edited, "v.csv", "v", 32767)),
             fmt::format("rank 1, position {} (2I0): no receive of its input from rank 0 is posted before it", column));
}

}  // namespace
}  // namespace pipetrain

namespace pipetrain {
namespace {

TEST(ProgramSimulation, MatchesTheScheduleSimulatorAndShowsWhereReceivesArePosted) {
  int n = 0;
  for (const char* name : {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zbv", "dualpipev"})
    for (int p : {2, 4})
      for (int m : {4, 8}) {
        Schedule s;
        try {
          s = make_schedule(name, {p, (std::string(name) == "zbv" || std::string(name) == "dualpipev") ? 2 : 1, m});
        } catch (const Error&) {
          continue;
        }
        SCOPED_TRACE(fmt::format("{} p={} m={}", name, p, m));
        // Free transfers: the same timeline as the schedule simulator.
        const SimResult a = simulate(s), b = simulate_program(lower(s), Costs{});
        EXPECT_DOUBLE_EQ(b.makespan, a.makespan);
        EXPECT_EQ(b.peak_inflight, a.peak_inflight);
        // Costly transfers: posting receives early never makes the step longer, and with
        // every receive posted at the start the program matches comm = transfer time.
        const TransferCosts t{4e6, 1e7, 0.05};  // 0.45 per transfer
        const double late = simulate_program(lower(s, {1, 32767}), Costs{}, t).makespan;
        const double early = simulate_program(lower(s, {1 << 20, 32767}), Costs{}, t).makespan;
        EXPECT_GE(late + 1e-12, early);
        Costs c;
        c.comm = t.time();
        EXPECT_DOUBLE_EQ(early, simulate(s, c).makespan);
        ++n;
      }
  EXPECT_GT(n, 15);
}

}  // namespace
}  // namespace pipetrain

namespace pipetrain {
namespace {

std::string in_order_problem(const Program& p) {
  try {
    validate_in_order(p);
  } catch (const Error& e) {
    return e.what();
  }
  return "(valid)";
}

using testing::error_of;

// The program builder composes the passes in one order: each recipe gives the program its
// passes give by hand, proven, and a recipe no pass can take is refused naming why.
TEST(ProgramBuilder, EachRecipeIsItsPassesInOrder) {
  const Schedule s = make_schedule("interleaved-1f1b", ScheduleParams{2, 2, 4});
  ProgramRecipe plain;
  plain.tag_ub = 32767;
  EXPECT_EQ(build_program(s, plain).per_rank, lower(s, {kRecvLookahead, 32767}).per_rank);
  ProgramRecipe in_order = plain;
  in_order.in_order = true;
  const Program posted = build_program(s, in_order);
  EXPECT_EQ(recv_lookahead(in_order), 1);
  EXPECT_EQ(posted.per_rank, post_for_in_order(lower(s, {1, 32767})).per_rank);
  EXPECT_EQ(in_order_problem(posted), "(valid)");
  ProgramRecipe vocab = plain;
  vocab.vocab_parallel = true;
  vocab.vocab_costs.vocab = {1e-3, 1.5, 1.5, 1e-3};
  EXPECT_EQ(build_program(s, vocab).per_rank, lower_vocab_parallel(s, {4, 32767}, vocab.vocab_costs).per_rank);
  ProgramRecipe file = plain;  // a compute+comms file runs as written
  file.comms_csv = to_comms_csv(lower(s));
  file.file = "given.csv";
  EXPECT_EQ(build_program(s, file).per_rank, lower(s).per_rank);

  ProgramRecipe both = file;
  both.vocab_parallel = true;
  EXPECT_HAS(error_of([&] { build_program(s, both); }), "given.csv: a compute+comms file has no vocabulary slices");
  vocab.in_order = true;
  EXPECT_HAS(error_of([&] { build_program(s, vocab); }), "in-order transfers) cannot run its collectives");
  // A file runs as written: receives it posts ahead of a peer's send are refused under
  // in-order transfers, not moved (1f1b with receives 4 ahead deadlocks there).
  const Schedule one_f_one_b = make_schedule("1f1b", {2, 1, 4});
  file.comms_csv = to_comms_csv(lower(one_f_one_b, {4, 32767}));
  file.in_order = true;
  EXPECT_HAS(error_of([&] { build_program(one_f_one_b, file); }), "deadlock with in-order transfers");
}

// Under NCCL's rules (messages of a pair matched in posting order, each rank's transfers
// in groups between its computes): every built-in, lowered with receives at their use
// and then posted earlier where a peer's send waits, runs; posted ahead blindly,
// receives block the sends the peer waits for.
TEST(InOrderTransfers, EveryBuiltinRunsOncePostedForInOrderTransfers) {
  const int checked = testing::for_each_builtin(
      [](const Schedule& s, int p, int m) {
        for (const Program& lowered :
             {lower(s, {1, 32767}), lower(forward_only_schedule(s.stage_to_rank, p, m), {1, 32767})}) {
          Program in_order;
          ASSERT_NO_THROW(in_order = post_for_in_order(lowered));
          EXPECT_EQ(problem(in_order), "(valid)");  // still a valid program for MPI
          EXPECT_EQ(in_order_problem(in_order), "(valid)");
          if (in_order_problem(lowered) == "(valid)") {
            EXPECT_EQ(in_order.per_rank, lowered.per_rank) << "moved without need";
          }
        }
      },
      2);
  EXPECT_GT(checked, 100);
}

TEST(InOrderTransfers, ReceivesPostedAheadDeadlockAndSwappedMessagesAreNamed) {
  // 1f1b on 2 ranks with receives 4 actions ahead: rank 0 posts 0RECV_B0 before it sends
  // 0SEND_F0, and rank 1 needs that activation before it can send the gradient.
  const Program ahead = lower(make_schedule("1f1b", {2, 1, 4}), {4, 32767});
  ASSERT_EQ(problem(ahead), "(valid)");  // fine with MPI's buffered sends
  EXPECT_HAS(in_order_problem(ahead),
             "deadlock with in-order transfers (comm.p2p = \"nccl\"): rank 0 waits at 0RECV_B0 (position 1) for rank "
             "1's 1SEND_B0 (position 6); rank 1 waits at 1RECV_F0 (position 1) for rank 0's 0SEND_F0 (position 3)");
  EXPECT_EQ(in_order_problem(post_for_in_order(lower(make_schedule("1f1b", {2, 1, 4}), {1, 32767}))), "(valid)");

  // Two sends swapped on rank 0: each is still received (MPI matches by tag), but NCCL
  // would deliver the first message into the first receive.
  Program p = lower(make_schedule("gpipe", {2, 1, 2}), {1, 32767});
  ASSERT_EQ(problem(p), "(valid)");
  auto& r0 = p.per_rank[0];
  const Instr first = r0[find(p, 0, "0SEND_F0")];
  r0.erase(r0.begin() + static_cast<long>(find(p, 0, "0SEND_F0")));
  r0.insert(r0.begin() + static_cast<long>(find(p, 0, "0SEND_F1")) + 1, first);  // F0 F1 SEND_F1 SEND_F0
  ASSERT_EQ(problem(p), "(valid)") << "still after their computes, so MPI is fine";
  EXPECT_HAS(in_order_problem(p), "rank 0's 1st send to rank 1 is 0SEND_F1 (position 3), but rank 1's 1st receive "
                                  "from rank 0 is 1RECV_F0 (position 1)");
  EXPECT_EQ(in_order_problem(post_for_in_order(p)), "(valid)") << "rank 1's receives follow rank 0's sends";
}

}  // namespace
}  // namespace pipetrain
