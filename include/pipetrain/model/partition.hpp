// How a model's units are split over pipeline stages. The units, in order: the embedding,
// each block's two residual halves (attention, then MLP: block_pair.hpp) and the head
// (final norm, LM head, loss). The embedding goes with stage 0 and the head with the last
// stage; the blocks as given by parallel.layers_per_stage (blocks per stage, where x.5
// ends a stage after a block's attention and begins the next with its MLP) or — "auto",
// the default — so that the slowest stage is as fast as it can be under the units' costs
// (the head of GPT-2 124M weighs about five blocks: an even split would idle every stage
// but the last, and whole blocks alone leave stages up to half a block apart).
// Exports: StageUnits, UnitCosts, PieceKind, StagePiece, stage_pieces, balanced_blocks,
// partition_stages, stage_cost, blocks_per_stage, model_num_units.
#pragma once
#include <vector>

#include "pipetrain/core/config.hpp"

namespace pipetrain {

// Units [first, last): 0 = embedding, 2i + 1 and 2i + 2 = block i's attention and MLP
// halves, 2 n_layer + 1 = the head.
struct StageUnits {
  int first = 0, last = 0;
};
int model_num_units(const ModelConfig& model);  // 2 n_layer + 2

// What a stage's layers are: its units with a block's two halves joined into one Block
// where the stage holds both.
enum class PieceKind { Embedding, Block, Attention, Mlp, Head };
struct StagePiece {
  PieceKind kind;
  int block = -1;  // for Block, Attention and Mlp
};
std::vector<StagePiece> stage_pieces(const ModelConfig& model, const StageUnits& units);

// The time of one microbatch's forward and backward through each kind of unit (any unit:
// only ratios matter), and the attention half's share of a block's (0: blocks are not
// split, stages hold whole blocks). The runtime measures them (runtime/unit_costs.hpp).
struct UnitCosts {
  double embedding = 0, block = 1, head = 0;
  double attention_share = 0;
  double attention() const { return attention_share * block; }
  double mlp() const { return block - attention(); }
  // Under vocabulary parallelism: the tables are every rank's slices, so the first stage
  // keeps only its positions and the last its final norm (a hundredth of a block).
  UnitCosts vocabulary_parallel() const {
    UnitCosts c = *this;
    c.embedding = 0, c.head = 0.01 * block;
    return c;
  }
};

// Blocks per stage (num_stages entries summing to model.n_layer; middle stages hold at
// least one unit; halves, x.5, where costs.attention_share is in (0, 1)) minimising the
// slowest stage's cost; among equally slow splits, the fewest blocks cut in two, then the
// most even stages (smallest sum of squared costs), then earlier stages holding more
// (deterministic: two dynamic programs over stages).
std::vector<double> balanced_blocks(const ModelConfig& model, int num_stages, const UnitCosts& costs);

// The units of every stage, for every model family (each is an embedding, its blocks and a
// head): layers_per_stage if given (multiples of 0.5), else balanced_blocks(costs).
std::vector<StageUnits> partition_stages(const ModelConfig& model, int num_stages,
                                         const std::vector<double>& layers_per_stage = {}, const UnitCosts& costs = {});

double stage_cost(const ModelConfig& model, const StageUnits& units, const UnitCosts& costs);

// The blocks each stage holds, halves as x.5 (the inverse of partition_stages).
std::vector<double> blocks_per_stage(const ModelConfig& model, const std::vector<StageUnits>& units);

}  // namespace pipetrain
