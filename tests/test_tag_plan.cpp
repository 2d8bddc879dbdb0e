// TagPlan: every cross-rank transfer of a step gets a tag unique per ordered pair of
// ranks, the range is dense, and a plan above the MPI's bound is refused up front.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <tuple>

#include "pipetrain/core/error.hpp"
#include "pipetrain/schedule/registry.hpp"
#include "pipetrain/schedule/tag_plan.hpp"

namespace pipetrain {
namespace {

// (source, destination, tag) of every transfer: unique, and dense per pair.
void expect_unique_and_dense(const std::vector<int>& stage_to_rank, const TagPlan& plan, bool gradients) {
  const int S = static_cast<int>(stage_to_rank.size());
  std::set<std::tuple<int, int, int>> seen;
  std::map<std::pair<int, int>, int> per_pair;
  for (int m = 0; m < plan.num_microbatches(); ++m)
    for (int s = 0; s < S; ++s)
      for (int kind = 0; kind < (gradients ? 2 : 1); ++kind) {
        const int producer = kind == 0 ? s - 1 : s + 1;
        if (producer < 0 || producer >= S) continue;
        const int src = stage_to_rank[static_cast<size_t>(producer)], dst = stage_to_rank[static_cast<size_t>(s)];
        if (src == dst) {
          EXPECT_THROW(plan.tag(static_cast<Transfer>(kind), m, s), Error) << "same-rank hand-off has no tag";
          continue;
        }
        const int tag = plan.tag(static_cast<Transfer>(kind), m, s);
        EXPECT_GE(tag, 0);
        EXPECT_LE(tag, plan.max_tag());
        EXPECT_TRUE(seen.insert({src, dst, tag}).second) << "tag " << tag << " reused from " << src << " to " << dst;
        ++per_pair[{src, dst}];
      }
  long total = 0;
  int largest = 0;
  for (const auto& [pair, n] : per_pair) total += n, largest = std::max(largest, n);
  EXPECT_EQ(total, plan.count());
  EXPECT_EQ(plan.max_tag(), largest - 1) << "tags are dense: the busiest pair uses 0 .. n-1";
}

TEST(TagPlan, EveryBuiltinScheduleUniqueAndDense) {
  for (const auto& [name, v] : std::vector<std::pair<std::string, int>>{
           {"gpipe", 1}, {"1f1b", 1}, {"interleaved-1f1b", 2}, {"zb-h1", 1}, {"zbv", 2}, {"dualpipev", 2}}) {
    SCOPED_TRACE(name);
    const Schedule s = make_schedule(name, ScheduleParams{4, v, 8});
    expect_unique_and_dense(s.stage_to_rank, TagPlan(s.stage_to_rank, 8, true, 32767), true);
    expect_unique_and_dense(s.stage_to_rank, TagPlan(s.stage_to_rank, 3, false, 32767), false);
  }
}

TEST(TagPlan, RealisticPipelinesFitTheStandardBound) {
  // pp 64 x 8 virtual stages (loop placement), 1024 microbatches: 8 transfers per
  // microbatch between neighbours, tags up to 8191 <= 32767.
  std::vector<int> loop;
  for (int v = 0; v < 8; ++v)
    for (int r = 0; r < 64; ++r) loop.push_back(r);
  const TagPlan plan(loop, 1024, true, 32767);
  EXPECT_EQ(plan.max_tag(), 1024 * 8 - 1);
}

TEST(TagPlan, RefusesAPlanAboveTheBoundNamingIt) {
  const Schedule s = make_schedule("interleaved-1f1b", ScheduleParams{2, 2, 8});
  // A stand-in bound. Stages 0..3 on ranks 0 1 0 1: rank 0 -> 1 carries the activations
  // into stages 1 and 3 and the gradient into stage 1, 3 per microbatch; 8 microbatches
  // need tags 0..23.
  EXPECT_NO_THROW(TagPlan(s.stage_to_rank, 8, true, 23));
  try {
    TagPlan(s.stage_to_rank, 8, true, 22);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("MPI_TAG_UB = 22"), std::string::npos) << msg;
    EXPECT_NE(msg.find("up to 23"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace pipetrain
