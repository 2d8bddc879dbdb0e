// Which way the CPU's dense fp32 products run, from their times measured on the node
// (core/dense_products.hpp): one rule, which the trainer applies at start-up and the
// planner prices each layout with.
//
// - A library per product (forward, input gradient, weight gradient): oneDNN's sgemm
//   where, summed over the model's weights, it is faster than the BLAS by more than
//   kLibraryMargin, else the BLAS (timing noise does not flip a choice).
// - Packing, per weight shape: a shape is packed where the step's uses of a weight save
//   more than its reorders cost, uses × (plain forward + dx − packed forward + dx) >
//   reorders, with the saving above kPackMargin of the plain products.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "pipetrain/core/config.hpp"
#include "pipetrain/core/dense_products.hpp"

namespace pipetrain {

inline constexpr double kLibraryMargin = 0.10;
inline constexpr double kPackMargin = 0.05;

// A dense weight shape of the model and how many weights of the whole model have it.
struct DenseShapeCount {
  DenseShape shape;
  int count = 1;
};
// Every dense weight shape a rank of tensor-parallel degree `tp` multiplies by: the
// blocks' (attention; MLP where it is not a mixture of experts) and the output layer's.
std::vector<DenseShapeCount> dense_weight_shapes(const ModelConfig& model, int tp);

// The shape a weight is timed at: its rows (outputs) capped at kTimedOutMax (a slice of it,
// such as the output layer's: the time scales with its rows).
inline constexpr int kTimedOutMax = 2048;
DenseShape timed_shape(DenseShape s);

// A shape's times, how many of the model's weights have it, and the factor from the timed
// shape to the real one.
struct DenseShapeUse {
  DenseShape shape;  // as the model has it (times.shape: as timed)
  DenseProductTimes times;
  int count = 1;
  double scale = 1;
};

struct DenseChoice {
  DensePaths paths;
  std::string why;                  // for the header: each product's library against the BLAS, the packed shapes
  std::vector<DenseShapeUse> from;  // the times it was chosen from (none where nothing was timed)
};

// `library`: the user's (runtime.dense_products), else chosen; `pack`: runtime.pack_weights
// (On packs every shape, Off none, Auto by the rule above); `uses_per_step`: the forward
// and dx products each weight runs in a step (its microbatches; 0 for inference).
DenseChoice choose_dense_paths(const std::vector<DenseShapeUse>& shapes, std::optional<ProductLibrary> library,
                               Toggle pack, int uses_per_step);

// The packing rule itself: the step's saving against the reorders.
bool packing_pays(double saved_per_use, double plain_per_use, double reorders, int uses_per_step);

}  // namespace pipetrain
