// The Trainer's parallel model: this rank's stages, what its executor runs beside the
// layers, the packed copies' memory test, and the model's size over the replica.
#include <algorithm>
#include <map>
#include <vector>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/core/grid_rules.hpp"
#include "pipetrain/model/partition.hpp"
#include "pipetrain/runtime/trainer.hpp"
#include "pipetrain/topology/node_memory.hpp"

namespace pipetrain {

// runtime.pack_weights = "auto"'s memory test, for this rank's copies once the split is
// known: every rank of the job keeps its packed shapes, or none does (one rule for the
// whole run, as the header says).
void Trainer::check_packed_copies_fit(const Config& cfg) {
  if (cfg.runtime.pack_weights != Toggle::Auto) return;
  std::vector<StagePiece> pieces;
  for (size_t s = 0; s < units_.size(); ++s)
    if (schedule_.stage_to_rank[s] == grid_.coords().pp)
      for (const StagePiece& p : stage_pieces(cfg.model, units_[s])) pieces.push_back(p);
  PackInputs in;
  in.can_pack = !dense_.paths.packed.empty();
  in.measured_pays = true;  // (choose_pack_weights' memory test alone: the timed rule has chosen)
  in.copies_bytes = 8.0 * rank_dense_weight_params(cfg.model, pieces, grid_.shape().tp,
                                                   vocab_parallel_ ? grid_.shape().pp * grid_.shape().tp : 0);
  in.memory_per_rank = node_memory_per_rank(grid_.world().comm());
  const PackChoice c = choose_pack_weights(in);
  double off = in.can_pack && !c.on ? 1.0 : 0.0;
  grid_.world().allreduce_max(&off, 1);
  if (off > 0 && !dense_.paths.packed.empty()) {
    dense_.paths.packed.clear();
    dense_.why += c.on ? "; not packed after all: another rank's copies would not fit in its memory"
                       : "; not packed after all: " + c.why;
    backend_.set_dense_paths(dense_.paths);
  }
}

double Trainer::peak_memory_bytes() const {
  return static_cast<double>(pool_->stats().peak_in_use_bytes) + static_cast<double>(backend_.packed_weights().bytes);
}

double Trainer::reserved_memory_bytes() const {
  return static_cast<double>(pool_->stats().reserved_bytes) + static_cast<double>(backend_.packed_weights().bytes);
}

// What the executor runs beside the layers: the vocabulary slices, the experts' exchanges,
// F&B overlap, packed documents' positions and sequence parallelism.
void Trainer::configure_executor(const Config& cfg, int me) {
  if (vocab_parallel_) {
    VocabRun v;
    v.slice = vocab_slice_.get();
    v.group = &grid_.comm("pp-tp");
    v.first_root = schedule_.stage_to_rank.front() * grid_.shape().tp;
    v.last_root = schedule_.stage_to_rank.back() * grid_.shape().tp;
    v.holds_first = me == schedule_.stage_to_rank.front();
    v.holds_last = me == schedule_.stage_to_rank.back();
    v.sums_to_all = grid_.shape().tp > 1;
    executor_->set_vocab(v);
  }
  if (grid_.shape().ep > 1) executor_->set_experts(comms_->ep(), comms_->ep_backward(), comms_->ep_in_order());
  executor_->set_overlap(cfg.schedule.overlap);
  if (grid_.shape().ep > 1 && cfg.schedule.overlap) executor_->set_progress(mpi_progress());
  executor_->set_packed_documents(source_.is_packed());
  if (const std::string e = grid_problem(cfg); !e.empty()) fail("{}", e);  // a config built in code
  executor_->set_sequence_parallel(sequence_parallel_on(cfg));
  if (grid_.shape().cp > 1) executor_->set_context_parallel(comms_->cp(), cfg.train.seq_len);
}

// This rank's stages of the schedule, each holding its units' layers.
std::map<int, ModelStage*> Trainer::build_stages() {
  const int me = grid_.coords().pp;
  const TensorParallel tp{grid_.coords().tp, grid_.shape().tp};
  const ExpertParallel ep{grid_.coords().ep, grid_.shape().ep};
  std::map<int, ModelStage*> mine;
  for (int s = 0; s < schedule_.num_stages; ++s) {
    if (schedule_.stage_to_rank[static_cast<size_t>(s)] != me) continue;
    const auto& u = units_[static_cast<size_t>(s)];
    stages_[s] = std::make_unique<ModelStage>(cfg_.model, u.first, u.last, params_, tp, vocab_parallel_, ep);
    mine[s] = stages_[s].get();
  }
  // Every rank of the replica: its slice of the vocabulary, by its place in the replica.
  if (vocab_parallel_)
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
    if (counts_in_norm(p) && p.trained)
      local += static_cast<double>(p.numel()) * (p.expert_parallel ? grid_.shape().ep : 1);
  grid_.comm("pp-tp").allreduce_sum(&local, 1);
  return static_cast<int64_t>(local);
}

}  // namespace pipetrain
