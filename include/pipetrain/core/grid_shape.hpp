// The process grid as one value: every parallel dimension by name, the rank order stated
// once, and groups of ranks named by the dimensions they span. The config
// (ParallelConfig), the planner's layouts (Layout), the topology (Grid), the run header,
// checkpoints and the memory estimate all hold this one type; a new dimension is one
// entry here. The rules a grid must keep live in core/grid_rules.hpp.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace pipetrain {

// The rank order, slowest-varying dimension first (Megatron's RankGenerator writes the
// same thing as one string). tp varies fastest, so a stage's tensor-parallel ranks, and
// then the cp ranks sharing a sequence, are neighbours (one node); pp varies slowest.
// "edp-ep" together are dp: expert parallelism splits the dp ranks into runs of ep
// consecutive ranks, each run holding every expert once (dp rank = edp * ep + ep rank).
//   world rank = (((pp * (dp/ep) + edp) * ep + ep_rank) * cp + cp_rank) * tp + tp_rank
inline constexpr std::string_view kRankOrder = "pp-edp-ep-cp-tp";

// A rank's place on every dimension (ep and edp are its dp coordinate's two parts).
struct GridCoords {
  int pp = 0, dp = 0, cp = 0, tp = 0;
  int ep = 0, edp = 0;
};

struct GridShape {
  int dp = 1, pp = 1, tp = 1;
  // Context parallelism: each sequence cut into 2 cp chunks over cp ranks (rank i holds
  // chunks i and 2cp-1-i), attention as a ring (model/ring_attention.hpp); the gradients
  // are summed over dp x cp.
  int cp = 1;
  // Expert parallelism, a view of dp: each MoE layer's experts are split over ep
  // consecutive dp ranks of a stage (ep divides dp and model.n_experts); tokens reach
  // their experts by all-to-all.
  int ep = 1;

  int64_t ranks() const { return int64_t{dp} * pp * cp * tp; }
  // The ranks holding the same parameters, over which gradients are summed: dp x cp.
  int replicas() const { return dp * cp; }
  // The dp ranks holding the same experts (dp / ep).
  int expert_dp() const { return dp / ep; }
  // The vocabulary group of parallel.vocab_parallel: every pp x tp rank of a replica.
  int vocab_slices() const { return pp * tp; }

  GridCoords coords_of(int rank) const;
  int rank_of(const GridCoords& c) const;

  // A group of ranks named by the dimensions it spans, "-" between names of kRankOrder
  // ("dp" stands for "edp-ep"): e.g. "dp-cp", the ranks that differ from `rank` only in
  // their dp and cp coordinates. group_color is equal exactly for the ranks of one group
  // (MPI_Comm_split's colour); group_rank numbers a group's ranks in the rank order.
  // Throws pipetrain::Error on an unknown name.
  int group_color(int rank, std::string_view dims) const;
  int group_rank(int rank, std::string_view dims) const;

  // "dp 2 x pp 2 x cp 1 x tp 1, ep 2": every dimension, for the run header and
  // `ckpt inspect`.
  std::string text() const;

  bool operator==(const GridShape&) const = default;
};

}  // namespace pipetrain
