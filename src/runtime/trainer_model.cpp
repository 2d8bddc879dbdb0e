// The Trainer's parallel model: this rank's stages, what its executor runs beside the
// layers, and the model's size over the replica.
#include <algorithm>
#include <map>
#include <vector>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/core/grid_rules.hpp"
#include "pipetrain/runtime/trainer.hpp"

namespace pipetrain {

double Trainer::peak_memory_bytes() const {
  return static_cast<double>(pool_->stats().peak_in_use_bytes) + static_cast<double>(backend_.packed_weights().bytes) +
         comms_->reduction_scratch_peak_bytes() + sync_->reduction_scratch_peak_bytes();
}

double Trainer::reserved_memory_bytes() const {
  return static_cast<double>(pool_->stats().reserved_bytes) + static_cast<double>(backend_.packed_weights().bytes) +
         comms_->reduction_scratch_peak_bytes() + sync_->reduction_scratch_peak_bytes();
}

// What the executor runs beside the layers: the vocabulary slices, the experts' exchanges,
// F&B overlap, packed documents' positions and sequence parallelism.
void Trainer::configure_executor(const Config& cfg, int me) {
  const Schedule& schedule = plan_.schedule;
  if (plan_.layout.vocab_parallel) {
    VocabRun v;
    v.slice = vocab_slice_.get();
    v.group = &grid_.comm("pp-tp");
    v.first_root = schedule.stage_to_rank.front() * grid_.shape().tp;
    v.last_root = schedule.stage_to_rank.back() * grid_.shape().tp;
    v.holds_first = me == schedule.stage_to_rank.front();
    v.holds_last = me == schedule.stage_to_rank.back();
    v.sums_to_all = grid_.shape().tp > 1;
    executor_->set_vocab(v);
  }
  if (grid_.shape().ep > 1) executor_->set_experts(comms_->ep(), comms_->ep_backward());
  executor_->set_pair_rule(pair_rule(grid_.shape().tp, grid_.shape().ep, plan_.layout.vocab_parallel,
                                     cfg.schedule.overlap, comms_->ep_in_order()));
  if (grid_.shape().ep > 1 && cfg.schedule.overlap) executor_->set_progress(mpi_progress());
  executor_->set_packed_documents(source_.is_packed());
  if (const std::string e = grid_problem(cfg); !e.empty()) fail("{}", e);  // a config built in code
  executor_->set_sequence_parallel(plan_.layout.sequence_parallel);
  if (grid_.shape().cp > 1) executor_->set_context_parallel(comms_->cp(), cfg.train.seq_len);
}

// This rank's stages of the schedule, each holding its units' layers.
std::map<int, ModelStage*> Trainer::build_stages() {
  const int me = grid_.coords().pp;
  const TensorParallel tp{grid_.coords().tp, grid_.shape().tp};
  const ExpertParallel ep{grid_.coords().ep, grid_.shape().ep};
  std::map<int, ModelStage*> mine;
  const bool vocab = plan_.layout.vocab_parallel;
  for (int s = 0; s < plan_.schedule.num_stages; ++s) {
    if (plan_.schedule.stage_to_rank[static_cast<size_t>(s)] != me) continue;
    const auto& u = plan_.split[static_cast<size_t>(s)];
    stages_[s] = std::make_unique<ModelStage>(cfg_.model, u.first, u.last, params_, tp, vocab, ep);
    mine[s] = stages_[s].get();
  }
  // Every rank of the replica: its slice of the vocabulary, by its place in the replica.
  if (vocab)
    vocab_slice_ = std::make_unique<VocabSlice>(
        cfg_.model, params_,
        TensorParallel{me * grid_.shape().tp + grid_.coords().tp, grid_.shape().pp * grid_.shape().tp});
  return mine;
}

// ZeRO-1's shard of the flat buffers, the dp reducer and the tied embedding's exchange
// between the first and last stage (each when this grid has one).
// On the CPU the dp buckets and the vocabulary collectives are MPI collectives: a helper
// thread keeps them moving (made at the first ask; none where MPI cannot host it).
ProgressThread* Trainer::mpi_progress() {
  if (!progress_ && cfg_.comm.progress_us > 0 && cfg_.runtime.device == "cpu" && ProgressThread::supported())
    progress_ = std::make_unique<ProgressThread>(std::chrono::microseconds(cfg_.comm.progress_us));
  return progress_.get();
}

int64_t Trainer::count_model_params() {
  // Whole-model size: sum over the replica's ranks, each value counted once.
  double local = 0;
  // (An expert-parallel parameter: its ep ranks hold a part each, of the same size.)
  for (const auto& p : params_.params())
    if (sync_->counts_in_norm(p) && p.trained)
      local += static_cast<double>(p.numel()) * (p.expert_parallel ? grid_.shape().ep : 1);
  grid_.comm("pp-tp").allreduce_sum(&local, 1);
  return static_cast<int64_t>(local);
}

}  // namespace pipetrain
