#include "pipetrain/runtime/trainer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <utility>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/core/fault.hpp"
#include "pipetrain/core/watchdog.hpp"

namespace pipetrain {

Trainer::Trainer(const Config& cfg, Grid& grid, Backend& backend, BatchSource source, TrainerUse use)
    : Trainer(cfg, resolve_run_plan(cfg, grid, backend, use), grid, backend, std::move(source), use) {}

Trainer::Trainer(const Config& cfg, RunPlan plan, Grid& grid, Backend& backend, BatchSource source, TrainerUse use)
    : cfg_(cfg),
      use_(use),
      grid_(grid),
      backend_(backend),
      source_(std::move(source)),
      pool_(MemoryPool::create(backend)),
      plan_(std::move(plan)),
      optimizer_(cfg.train) {
  const bool training = use == TrainerUse::Train;
  if (cfg.model.n_experts > 0 && training) moe_stats_ = std::make_unique<MoeStepStats>(cfg.model);
  const std::map<int, ModelStage*> mine = build_stages();
  const int me = grid.coords().pp;
  // parallel.shard over the replicas (training only: inference holds the whole weights).
  const ShardLevel level = training ? plan_.layout.shard : ShardLevel::None;  // (none with one replica)
  const bool units = level >= ShardLevel::Gradients;
  // The tied table on two ranks is updated on the last stage only (GradientSync::update):
  // the first stage keeps no moments for its copy. (ZeRO-1's shards cover the flat buffer;
  // under unit shards both copies take the same update.)
  const int first = plan_.schedule.stage_to_rank.front();
  // (Under vocabulary parallelism each rank's slice serves both roles: no pair.)
  const int last = cfg.model.tied() && !plan_.layout.vocab_parallel ? plan_.schedule.stage_to_rank.back() : first;
  if (training && level == ShardLevel::None && first != last && me == first)
    if (Parameter* wte = params_.find("wte")) wte->updated = false;
  RankUnits rank_units = units ? number_units(mine, cfg.model.tied()) : RankUnits{};
  // (ZeRO-1 shards the part every ep rank holds alike over dp, the expert-parallel part over
  // the dp / ep ranks holding the same experts; unit shards each unit's run over dp x cp.)
  params_.allocate(*pool_, backend_,
                   {.moments = training && level == ShardLevel::None,
                    .grads = training && !units,
                    .align = 16 * grid.comm("dp-cp").size(),
                    .expert_align = 16 * grid.shape().expert_dp(),
                    .unit_align = units ? 16 * grid.comm("dp-cp").size() : 0,  // (a multiple of a shard group's)
                    .values = level != ShardLevel::Weights});
  // (Sharded weights: the initial values go into the unit shards, made below.)
  if (training && level != ShardLevel::Weights) params_.initialize(cfg.train.seed, backend_);
  const bool bf16 = cfg.train.precision == "bf16";
  // The bf16-rounded weights products use; under sharded weights each gathered unit's
  // (runtime/unit_shards.hpp).
  if (bf16 && level != ShardLevel::Weights) params_.allocate_compute(*pool_, backend_);
  // The tied embedding lives on the first and the last stage; when those are different
  // ranks their gradients are summed every step (and the last stage's copy is not
  // counted again in the gradient norm).
  // (An untied head, Llama's default, shares nothing: no pair.)
  comms_ = std::make_unique<DeviceComms>(grid, backend_, cfg.comm.p2p, first, last);
  std::map<int, Recompute> recompute;  // train.recompute on parallel.recompute_stages
  for (size_t st = 0; st < plan_.stage_recompute.size(); ++st)
    recompute[static_cast<int>(st)] = plan_.stage_recompute[st];
  executor_ = std::make_unique<PipelineExecutor>(mine, comms_->pp(), &comms_->tp(), backend_, *pool_, cfg.model.d_model,
                                                 bf16 ? DType::BF16 : DType::F32, recompute);
  configure_executor(cfg, me);
  // The step's program (and evaluation's, when configured): every transfer and tag is
  // fixed, checked against the MPI's bound and proven deadlock-free now, before any compute.
  recipe_ = pipetrain::program_recipe(cfg, plan_, grid.comm("pp").tag_ub(), comms_->pp_in_order());
  if (units)  // the units' collectives are placed from the plan's units: this rank's must be them
    check_units(rank_units, recipe_.units.layers.at(static_cast<size_t>(me)));
  else
    recipe_.shard = {};  // (inference, one replica: nothing sharded)
  train_program_ = build_program(plan_.schedule, recipe_);
  if (!cfg.data.val.empty() && cfg.train.eval_every > 0)
    eval_program(cfg.train.eval_batches * cfg.train.global_batch / grid.shape().dp / microbatch_size());
  sync_ = std::make_unique<GradientSync>(GradientSync::Parts{params_, backend_, *pool_, *comms_, grid_, cfg_,
                                                             [this] { return mpi_progress(); }, vocab_slice_.get()},
                                         mine, level, std::move(rank_units));
  // Inference: a checkpoint's weights come next.
  if (training && level == ShardLevel::Weights) sync_->initialize(cfg.train.seed);
  model_params_ = count_model_params();
}

Trainer::~Trainer() = default;

ModelStage& Trainer::stage(int s) const {
  const auto it = stages_.find(s);
  if (it == stages_.end()) fail("stage {} is not on this rank", s);
  return *it->second;
}

int64_t Trainer::tokens_per_step() const { return static_cast<int64_t>(cfg_.train.global_batch) * cfg_.train.seq_len; }

StepMetrics Trainer::train_step(int step) {
  if (use_ != TrainerUse::Train) fail("train_step on a trainer built for inference (it holds no gradients)");
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t step_tokens = tokens_per_step();
  const int64_t step_first = static_cast<int64_t>(step) * cfg_.train.global_batch;
  const int64_t first =
      step_first + static_cast<int64_t>(grid_.coords().dp) * (cfg_.train.global_batch / grid_.shape().dp);
  // The loss is the mean over the step's targets that count (all of them unless packed).
  const int64_t step_targets = source_.is_packed() ? source_.targets(step_first, cfg_.train.global_batch) : step_tokens;
  const MicrobatchLoader load = loader(source_, first);
  ExecutorHooks hooks;
  hooks.step = step;
  sync_->begin_step(hooks);
  if (moe_stats_) {
    moe_stats_->clear();
    hooks.moe = grid_.coords().tp == 0 ? moe_stats_.get() : nullptr;  // tp ranks route alike: count once
  }
  StepMetrics out;
  out.step = step;
  auto since = [last = t0]() mutable {
    const auto now = std::chrono::steady_clock::now();
    const double s = std::chrono::duration<double>(now - last).count();
    last = now;
    return s;
  };
  backend_.defer_checks(true);  // a device backend checks the step's token ids and targets once, below
  last_stats_ = executor_->run(train_program_.per_rank[static_cast<size_t>(grid_.coords().pp)], load, microbatch_size(),
                               local_seq_len(), 1.0f / static_cast<float>(step_targets), trace_, hooks);
  backend_.defer_checks(false);
  out.phases.program_s = since();
  if (const UnitShards* units = sync_->units()) out.gather_wait_s = units->gather_wait_s();
  watchdog::set_position(fmt::format("step {}, gradient reduction", step));
  sync_->reduce();
  out.phases.reduce_s = since();
  watchdog::set_position(fmt::format("step {}, loss and gradient norm", step));

  // This rank's part of the gradient norm first, then the reductions: a rank whose
  // gradients are final early (a pipeline's last stage) reads them while the others still
  // compute, not after waiting for them. The norm sums over one replica (each value once);
  // under ZeRO-1 or with one replica that is the whole grid, and one reduction carries all.
  // Expert-parallel gradients sum over the whole grid, where dp / ep ranks hold each.
  double sums[4] = {grid_.coords().tp == 0 ? last_stats_.loss_sum : 0.0,
                    last_stats_.total_s > 0 ? 1.0 - last_stats_.compute_s / last_stats_.total_s : 0.0,
                    sync_->local_expert_squares(), sync_->local_squares()};
  if (sync_->partitions_norm() || grid_.comm("dp-cp").size() == 1) {
    grid_.world().allreduce_sum(sums, 4);
  } else {
    grid_.world().allreduce_sum(sums, 3);
    grid_.comm("pp-tp").allreduce_sum(&sums[3], 1);
  }
  out.loss = sums[0] / static_cast<double>(step_targets);
  out.bubble_fraction = sums[1] / grid_.world_size();
  out.peak_stashed = last_stats_.peak_stashed;
  out.pp_bytes_sent = last_stats_.bytes_sent;
  out.grad_norm = std::sqrt(sums[3] + sums[2] / grid_.shape().expert_dp());
  if (moe_stats_) expert_metrics(out);
  out.phases.norm_s = since();
  out.lr = learning_rate(cfg_.train, step);
  if (!std::isfinite(out.loss) || !std::isfinite(out.grad_norm)) {
    if (cfg_.runtime.on_nonfinite != "skip")
      fail(
          "step {}: non-finite {} ({}); stopping before the update (runtime.on_nonfinite = \"skip\" skips such "
          "steps)",
          step, std::isfinite(out.loss) ? "gradient norm" : "loss", std::isfinite(out.loss) ? out.grad_norm : out.loss);
    out.skipped = true;  // every rank sees the same reduced values, so all skip together
  } else {
    watchdog::set_position(fmt::format("step {}, optimizer", step));
    sync_->update(optimizer_, step, out.lr, clip_scale(out.grad_norm, cfg_.train.grad_clip));
    if (moe_stats_ && cfg_.model.router_bias_rate > 0) update_selection_biases();
  }
  out.phases.optimizer_s = since();
  out.step_time_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Ranks finish at slightly different times; report the slowest.
  grid_.world().allreduce_max(&out.step_time_s, 1);
  out.tokens_per_s = static_cast<double>(step_tokens) / out.step_time_s;
  return out;
}

std::vector<float> Trainer::reduced_gradients() { return sync_->reduced_gradients(); }

void Trainer::gather_weights() {
  if (UnitShards* units = sync_->units(); units && units->shards_weights()) units->gather_all();
}

const Program& Trainer::eval_program(int microbatches) {
  if (microbatches > 0 && eval_program_.num_microbatches != microbatches) {
    ProgramRecipe forward = recipe_;
    forward.comms_csv.clear();  // a file's program is the training step's
    eval_program_ = build_program(
        forward_only_schedule(plan_.schedule.stage_to_rank, plan_.schedule.num_ranks, microbatches), forward);
  }
  return eval_program_;
}

}  // namespace pipetrain
