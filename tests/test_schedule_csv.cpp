// Schedule files: PyTorch compute-only CSV round trips of every built-in, PyTorch-style
// cells, idle (empty) cells, whitespace, placements, bad cells, and the sample files in
// inputs/schedules/.
#include <gtest/gtest.h>

#include <string>

#include "pipetrain/core/error.hpp"
#include "pipetrain/schedule/csv.hpp"
#include "pipetrain/schedule/registry.hpp"
#include "pipetrain/schedule/validate.hpp"
#include "test_files.hpp"

namespace pipetrain {
namespace {

using testing::error_of;

void expect_same(const Schedule& a, const Schedule& b) {
  EXPECT_EQ(a.num_ranks, b.num_ranks);
  EXPECT_EQ(a.num_stages, b.num_stages);
  EXPECT_EQ(a.num_microbatches, b.num_microbatches);
  EXPECT_EQ(a.stage_to_rank, b.stage_to_rank);
  EXPECT_EQ(a.per_rank, b.per_rank);
}

TEST(ScheduleCsv, EveryBuiltinRoundTrips) {
  struct Case {
    const char* name;
    int v;
    const char* placement;
  };
  for (const Case& c : {Case{"gpipe", 1, "loop"}, Case{"1f1b", 1, "loop"},
                        Case{"interleaved-1f1b", 2, "loop"}, Case{"interleaved-1f1b", 3, "loop"},
                        Case{"looped-bfs", 3, "loop"}, Case{"zb-h1", 1, "loop"},
                        Case{"zbv", 2, "v"}, Case{"dualpipev", 2, "v"}})
    for (int p : {1, 2, 4})
      for (int m : {8, 12}) {
        SCOPED_TRACE(fmt::format("{} p={} v={} m={}", c.name, p, c.v, m));
        const Schedule s = make_schedule(c.name, {p, c.v, m});
        const std::string text = to_csv(s);
        const Schedule back = from_csv(text, "dump.csv", c.placement);
        expect_same(s, back);
        if (!s.pairs.empty()) {
          EXPECT_EQ(back.pairs, s.pairs);  // dualpipev's F&B pairs: "0F3&,3B1"
        }
        EXPECT_EQ(back.name, "dump.csv");
        EXPECT_NO_THROW(validate(back));
        EXPECT_EQ(to_csv(back), text);
      }
}

TEST(ScheduleCsv, WritesOneRowPerRank) {
  EXPECT_EQ(to_csv(make_schedule("1f1b", {2, 1, 2})), "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n");
}

TEST(ScheduleCsv, ReadsPyTorchCellsIdleCellsAndWhitespace) {
  // Rank 1 idles at first (empty cells), CRLF line ends, spaces around cells, trailing
  // blank lines, a quoted cell.
  const std::string text =
      "0F0, 0F1 ,,0I0,0W0,\"0I1\",0W1\r\n"
      ",, 1F0,1I0 ,1F1,1I1,1W0,1W1\r\n\r\n\n";
  const Schedule s = from_csv(text, "pt.csv", "loop");
  EXPECT_EQ(s.num_ranks, 2);
  EXPECT_EQ(s.num_stages, 2);
  EXPECT_EQ(s.num_microbatches, 2);
  ASSERT_EQ(s.per_rank[0].size(), 6u);
  ASSERT_EQ(s.per_rank[1].size(), 6u);
  EXPECT_EQ(s.per_rank[1][0], (Action{Op::F, 0, 1}));
  EXPECT_EQ(s.per_rank[0][2], (Action{Op::I, 0, 0}));
  EXPECT_EQ(s.per_rank[0][5], (Action{Op::W, 1, 0}));
  EXPECT_NO_THROW(validate(s));
}

TEST(ScheduleCsv, MultiDigitIndices) {
  const Schedule s = from_csv("12B34\n", "big.csv", "loop");
  EXPECT_EQ(s.per_rank[0][0], (Action{Op::B, 34, 12}));
  EXPECT_EQ(s.num_stages, 13);
  EXPECT_EQ(s.num_microbatches, 35);
}

TEST(ScheduleCsv, Placements) {
  const std::string text = "0F0,3F0,3B0,0B0\n1F0,2F0,2B0,1B0\n";
  EXPECT_EQ(from_csv(text, "v.csv", "v").stage_to_rank, (std::vector<int>{0, 1, 1, 0}));
  EXPECT_NO_THROW(validate(from_csv(text, "v.csv", "v")));
  const Schedule explicit_map = from_csv(text, "v.csv", " 0, 1,1 ,0 ");
  EXPECT_EQ(explicit_map.stage_to_rank, (std::vector<int>{0, 1, 1, 0}));
  // The loop placement puts stage 3 on rank 1: validation says so.
  EXPECT_NE(error_of([&] { validate(from_csv(text, "v.csv", "loop")); })
                .find("action 3F0 is on the wrong rank: stage 3 lives on rank 1"),
            std::string::npos);
  EXPECT_NE(error_of([&] { from_csv(text, "v.csv", "0,1,1"); })
                .find("v.csv: placement \"0,1,1\" places 3 stages, but the file uses stage 3"),
            std::string::npos);
  EXPECT_NE(error_of([&] { from_csv(text, "v.csv", "zigzag"); }).find("v.csv: placement"),
            std::string::npos);
}

TEST(ScheduleCsv, BadCellsNameFileRankAndColumn) {
  EXPECT_NE(error_of([] { from_csv("0F0,0B0\n1F0,1B0,2X0\n", "x.csv", "loop"); })
                .find("x.csv: rank 1, column 3: bad cell \"2X0\""),
            std::string::npos);
  for (const char* cell : {"F0", "0F", "0f0", "0F-1", "a0F0", "0SEND_F0", "0 F0"}) {
    const std::string msg =
        error_of([&] { from_csv(std::string("0F0,") + cell + "\n", "y.csv", "loop"); });
    EXPECT_NE(msg.find("y.csv: rank 0, column 2: bad cell"), std::string::npos)
        << cell << ": " << msg;
  }
}

TEST(ScheduleCsv, EmptyFiles) {
  EXPECT_NE(error_of([] { from_csv("", "e.csv", "loop"); }).find("e.csv: empty schedule file"),
            std::string::npos);
  EXPECT_NE(error_of([] { from_csv(",,\n,\n", "e.csv", "loop"); }).find("e.csv: the schedule has no actions"),
            std::string::npos);
  EXPECT_NE(error_of([] { read_schedule_file("/nonexistent/s.csv", "loop"); })
                .find("/nonexistent/s.csv: cannot open"),
            std::string::npos);
}

// Found by fuzzing: one stray index must not make the reader or the validator allocate
// gigabytes.
TEST(ScheduleCsv, HugeIndicesAreRefused) {
  const std::string msg = error_of([] { from_csv("0F999999999\n", "h.csv", "loop"); });
  EXPECT_NE(msg.find("h.csv: rank 0, column 1: cell \"0F999999999\" is beyond the largest"), std::string::npos)
      << msg;
  const Schedule s = from_csv("0F0,0B0,0F40000,0B40000\n", "h.csv", "loop");  // parses, but is incomplete
  const std::string v = error_of([&] { validate(s); });
  EXPECT_NE(v.find("1 stages x 40001 microbatches need at least 40001 forwards, but the schedule has only 4"),
            std::string::npos)
      << v;
}

// Found by fuzzing: an idle last rank survives the round trip (it is not a blank line).
TEST(ScheduleCsv, IdleRanksRoundTrip) {
  const Schedule s = from_csv("0F0,0B0\n,\n", "i.csv", "0");
  ASSERT_EQ(s.num_ranks, 2);
  const Schedule back = from_csv(to_csv(s), "i.csv", "0");
  EXPECT_EQ(back.num_ranks, 2);
  EXPECT_EQ(back.per_rank, s.per_rank);
}

TEST(ScheduleCsv, SampleFilesValidate) {
  struct Sample {
    const char* file;
    const char* placement;
    int ranks, stages, microbatches;
  };
  for (const Sample& f : {Sample{"1f1b-4x8.csv", "loop", 4, 4, 8},
                          Sample{"zb-h1-3x4-hand.csv", "loop", 3, 3, 4},
                          Sample{"zbv-2x4.csv", "v", 2, 4, 4}}) {
    SCOPED_TRACE(f.file);
    const Schedule s =
        read_schedule_file(std::string(PIPETRAIN_SOURCE_DIR) + "/inputs/schedules/" + f.file,
                           f.placement);
    EXPECT_EQ(s.num_ranks, f.ranks);
    EXPECT_EQ(s.num_stages, f.stages);
    EXPECT_EQ(s.num_microbatches, f.microbatches);
    EXPECT_NO_THROW(validate(s));
  }
  // The 1F1B sample is exactly the built-in.
  EXPECT_EQ(read_schedule_file(std::string(PIPETRAIN_SOURCE_DIR) + "/inputs/schedules/1f1b-4x8.csv",
                               "loop")
                .per_rank,
            make_schedule("1f1b", {4, 1, 8}).per_rank);
}

}  // namespace
}  // namespace pipetrain
