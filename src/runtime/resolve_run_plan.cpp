// A run's plan on its node (runtime/resolve_run_plan.hpp).
#include "pipetrain/runtime/resolve_run_plan.hpp"

#include <vector>

#include "pipetrain/core/error.hpp"
#include "pipetrain/core/grid_rules.hpp"
#include "pipetrain/plan/cost_model.hpp"
#include "pipetrain/runtime/product_timing.hpp"
#include "pipetrain/runtime/unit_costs.hpp"
#include "pipetrain/topology/node_memory.hpp"

namespace pipetrain {

namespace {

// runtime.pack_weights = "auto"'s memory test, for this rank's copies once the split is
// known: every rank of the job keeps its packed shapes, or none does (one rule for the
// whole run, as the header says).
void check_packed_copies_fit(RunPlan& plan, const Config& cfg, Grid& grid, Backend& backend) {
  if (cfg.runtime.pack_weights != Toggle::Auto) return;
  std::vector<StagePiece> pieces;
  for (size_t s = 0; s < plan.split.size(); ++s)
    if (plan.schedule.stage_to_rank[s] == grid.coords().pp)
      for (const StagePiece& p : stage_pieces(cfg.model, plan.split[s])) pieces.push_back(p);
  PackInputs in;
  DenseChoice& dense = plan.dense;
  in.can_pack = !dense.paths.packed.empty();
  in.measured_pays = true;  // (choose_pack_weights' memory test alone: the timed rule has chosen)
  in.copies_bytes = 8.0 * rank_dense_weight_params(cfg.model, pieces, grid.shape().tp,
                                                   plan.layout.vocab_parallel ? grid.shape().pp * grid.shape().tp : 0);
  in.memory_per_rank = node_memory_per_rank(grid.world().comm());
  const PackChoice c = choose_pack_weights(in);
  double off = in.can_pack && !c.on ? 1.0 : 0.0;
  grid.world().allreduce_max(&off, 1);
  if (off > 0 && !dense.paths.packed.empty()) {
    dense.paths.packed.clear();
    dense.why += c.on ? "; not packed after all: another rank's copies would not fit in its memory"
                      : "; not packed after all: " + c.why;
    backend.set_dense_paths(dense.paths);
  }
}

}  // namespace

RunPlan resolve_run_plan(const Config& cfg, Grid& grid, Backend& backend, TrainerUse use) {
  if (const std::string e = batch_split_problem(cfg.train.global_batch, cfg.parallel.dp, cfg.train.microbatches);
      !e.empty())
    fail("{}", e);
  const bool training = use == TrainerUse::Train;
  if (!training && grid.world_size() > 1)
    fail("a trainer for inference runs on one rank; this grid has {}", grid.world_size());
  RunPlan plan = plan_run(cfg);
  const int mb = plan.layout.microbatch_size, tokens = plan.local_seq_len(cfg);
  // The dense products' paths before the units are measured, so they are measured as the
  // run will multiply ("auto" weighs the copies once the split is known, below).
  plan.dense = apply_dense_paths(cfg, backend, grid.shape().tp, mb * tokens, training ? cfg.train.microbatches : 0,
                                 grid.world().comm(), training ? product_times_cache(cfg) : "");
  if (training && grid.comm("dp-cp").size() > 1 && plan.layout.shard == ShardLevel::Weights &&
      !plan.dense.paths.packed.empty()) {  // (a unit's weights are whole only around its work)
    plan.dense.paths.packed.clear();
    plan.dense.why += "; not packed: parallel.shard = \"weights\" gathers each unit's weights around its work";
    backend.set_dense_paths(plan.dense.paths);
  }
  UnitCosts costs;  // parallel.layers_per_stage = "auto": balance the stages by the units' measured costs
  if (cfg.parallel.layers_per_stage.empty() && plan.schedule.num_stages > 1)
    costs = measure_unit_costs(cfg.model, backend, grid, mb, tokens,
                               cfg.train.precision == "bf16" ? DType::BF16 : DType::F32);  // a rank's tokens
  plan.layout.vocab_parallel = plan.layout.vocab_parallel && training;
  split_stages(plan, cfg, costs);
  check_packed_copies_fit(plan, cfg, grid, backend);
  return plan;
}

}  // namespace pipetrain
