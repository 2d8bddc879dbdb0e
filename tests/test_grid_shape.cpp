// The grid as one value (core/grid_shape.hpp): its coordinates, the groups named by their
// dimensions against the communicator formulas they replaced, its text, and its rules;
// checkpoints record every dimension and read older files without cp and ep.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "pipetrain/core/error.hpp"
#include "pipetrain/core/grid_rules.hpp"
#include "pipetrain/core/grid_shape.hpp"
#include "pipetrain/io/checkpoint.hpp"

namespace pipetrain {
namespace {

// Every shape of at most 24 ranks with dp up to 4 and ep dividing dp.
std::vector<GridShape> small_shapes() {
  std::vector<GridShape> all;
  for (int dp = 1; dp <= 4; ++dp)
    for (int pp = 1; pp <= 3; ++pp)
      for (int cp = 1; cp <= 2; ++cp)
        for (int tp = 1; tp <= 2; ++tp)
          for (int ep = 1; ep <= dp; ++ep)
            if (dp % ep == 0) all.push_back({dp, pp, tp, cp, ep});
  return all;
}

// The (colour, key) pairs of the nine MPI_Comm_split calls the grid made before it named
// its groups, written out as they were; each is what one named group must reproduce.
using Formula = std::function<std::pair<int, int>(const GridShape&, const GridCoords&)>;
std::map<std::string, Formula> former_formulas() {
  return {
      {"tp",
       [](const GridShape& g, const GridCoords& c) {
         return std::pair{c.pp * g.dp * g.cp + c.dp * g.cp + c.cp, c.tp};
       }},
      {"dp-cp",
       [](const GridShape& g, const GridCoords& c) {
         return std::pair{c.pp * g.tp + c.tp, c.dp * g.cp + c.cp};
       }},
      {"pp",
       [](const GridShape& g, const GridCoords& c) {
         return std::pair{(c.dp * g.cp + c.cp) * g.tp + c.tp, c.pp};
       }},
      {"pp-tp",
       [](const GridShape& g, const GridCoords& c) {
         return std::pair{c.dp * g.cp + c.cp, c.pp * g.tp + c.tp};
       }},
      {"cp",
       [](const GridShape& g, const GridCoords& c) {
         return std::pair{(c.pp * g.dp + c.dp) * g.tp + c.tp, c.cp};
       }},
      {"ep",
       [](const GridShape& g, const GridCoords& c) {
         const int stage = (c.pp * g.tp + c.tp) * g.cp + c.cp;
         return std::pair{stage * g.dp + c.dp / g.ep, c.dp % g.ep};
       }},
      {"edp",
       [](const GridShape& g, const GridCoords& c) {
         const int stage = (c.pp * g.tp + c.tp) * g.cp + c.cp;
         return std::pair{stage * g.dp + c.dp % g.ep, c.dp / g.ep};
       }},
  };
}

TEST(GridShape, CoordinatesFollowTheRankOrder) {
  for (const GridShape& g : small_shapes())
    for (int r = 0; r < g.ranks(); ++r) {
      const GridCoords c = g.coords_of(r);
      ASSERT_EQ(g.rank_of(c), r) << g.text();
      EXPECT_EQ(c.dp, c.edp * g.ep + c.ep) << g.text();
      EXPECT_LT(c.edp, g.expert_dp()) << g.text();
    }
  // tp fastest, then cp, dp, pp: rank 5 of dp 2 x pp 2 x cp 1 x tp 2 is pp 1, dp 0, tp 1.
  const GridCoords c = GridShape{2, 2, 2, 1, 1}.coords_of(5);
  EXPECT_EQ(std::vector<int>({c.pp, c.dp, c.cp, c.tp}), std::vector<int>({1, 0, 0, 1}));
}

// Each named group holds exactly the ranks the former formula put together, numbered in
// the same order: the communicators, and so every collective's order of summation, are
// those of before.
TEST(GridShape, NamedGroupsAreTheFormerCommunicators) {
  for (const auto& [dims, formula] : former_formulas()) {
    for (const GridShape& g : small_shapes()) {
      for (int a = 0; a < g.ranks(); ++a) {
        for (int b = 0; b < g.ranks(); ++b) {  // every pair of ranks
          const auto [colour_a, key_a] = formula(g, g.coords_of(a));
          const auto [colour_b, key_b] = formula(g, g.coords_of(b));
          const bool together = g.group_color(a, dims) == g.group_color(b, dims);
          ASSERT_EQ(together, colour_a == colour_b) << dims << " on " << g.text() << ", ranks " << a << ", " << b;
          if (together) {
            ASSERT_EQ(g.group_rank(a, dims) < g.group_rank(b, dims), key_a < key_b) << dims << " on " << g.text();
          }
        }
      }
    }
  }
}

TEST(GridShape, GroupRanksNumberEachGroupFromZero) {
  const GridShape g{4, 2, 2, 1, 2};
  for (const char* dims : {"tp", "dp-cp", "pp", "pp-tp", "cp", "ep", "edp", "dp", "pp-dp-cp-tp"}) {
    std::map<int, std::vector<int>> groups;
    for (int r = 0; r < g.ranks(); ++r) groups[g.group_color(r, dims)].push_back(g.group_rank(r, dims));
    for (auto& [colour, ranks] : groups) {
      std::sort(ranks.begin(), ranks.end());
      for (size_t i = 0; i < ranks.size(); ++i) {
        ASSERT_EQ(ranks[i], static_cast<int>(i)) << dims;
      }
    }
  }
  EXPECT_EQ(g.group_rank(g.ranks() - 1, "pp-dp-cp-tp"), g.ranks() - 1);  // every dimension: the world
  EXPECT_THROW(g.group_color(0, "dp-xp"), Error);
}

TEST(GridShape, TextAndRulesNameEveryDimension) {
  EXPECT_EQ((GridShape{4, 2, 2, 3, 2}.text()), "dp 4 x pp 2 x cp 3 x tp 2, ep 2");
  EXPECT_EQ(grid_shape_problem({4, 2, 2, 3, 2}, 48), "");
  EXPECT_NE(grid_shape_problem({4, 2, 2, 3, 2}, 47).find("= 48 does not match the 47 MPI ranks"), std::string::npos);
  EXPECT_NE(grid_shape_problem({4, 1, 1, 1, 3}, 4).find("parallel.ep (3) must divide parallel.dp (4)"),
            std::string::npos);
  EXPECT_NE(grid_shape_problem({1, 1, 1, 0, 1}, 0).find("parallel.cp (0) must be >= 1"), std::string::npos);
}

class GridInCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("pipetrain_grid_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const GridShape& g) {
    CheckpointMeta meta;
    meta.grid = g;
    meta.config_toml = "[model]\n";
    std::vector<float> v(4, 1.0f);
    CheckpointTensor t{"params/x", {4}, Shard{}, v.data(), true};
    const std::string path = (dir_ / "c.h5").string();
    write_checkpoint(path, MPI_COMM_SELF, meta, {t});
    return path;
  }
  std::filesystem::path dir_;
};

TEST_F(GridInCheckpoint, EveryDimensionIsRecorded) {
  const GridShape g{4, 2, 2, 3, 2};
  EXPECT_EQ(read_checkpoint_meta(write(g)).grid, g);
}

// A file written before cp and ep were recorded reads as cp 1, ep 1.
TEST_F(GridInCheckpoint, OlderFilesWithoutCpAndEpReadAsOne) {
  const std::string path = write({2, 2, 1, 3, 2});
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  ASSERT_GE(H5Adelete(file, "grid_cp"), 0);
  ASSERT_GE(H5Adelete(file, "grid_ep"), 0);
  H5Fclose(file);
  EXPECT_EQ(read_checkpoint_meta(path).grid, (GridShape{2, 2, 1, 1, 1}));
}

}  // namespace
}  // namespace pipetrain
