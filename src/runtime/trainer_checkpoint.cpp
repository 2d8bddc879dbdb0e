// Trainer::save_checkpoint / load_checkpoint: the bridge between this rank's parameter
// shards and the grid-independent checkpoint file.
#include <fmt/format.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/io/checkpoint.hpp"
#include "pipetrain/runtime/trainer.hpp"

namespace pipetrain {

namespace {

// The elements of a tensor's data on this rank: its slice, or its local shard.
int64_t local_elements(const CheckpointTensor& t) {
  if (t.partial()) return t.flat_end - t.flat_begin;
  int64_t n = 1;
  for (const int64_t len : local_shape(t.global_shape, t.shard)) n *= len;
  return n;
}

// Device memory reaches the file through host copies, so the HDF5 format is the same on
// every device: a GPU run's checkpoint resumes on the CPU and the reverse. On the host
// the tensors are used where they are, unless PIPETRAIN_STAGE_CHECKPOINTS=1 (the CPU
// tests' way to run the GPU's path: checkpoint_resume.sh).
class HostStaging {
 public:
  // Points each tensor's data at a host buffer, filled from the device when `copy_out`.
  HostStaging(Backend& backend, std::vector<CheckpointTensor>& tensors, bool copy_out) : backend_(backend) {
    const char* force = std::getenv("PIPETRAIN_STAGE_CHECKPOINTS");
    if (backend.device().kind == DeviceKind::Host && !(force && std::string(force) == "1")) return;
    for (auto& t : tensors) {
      if (!t.data) continue;
      host_.emplace_back(static_cast<size_t>(local_elements(t)));
      device_.push_back(t.data);
      if (copy_out) backend.to_host(host_.back().data(), t.data, host_.back().size() * sizeof(float));
      t.data = host_.back().data();
    }
  }
  // Copies what was read back into device memory.
  void copy_in() {
    for (size_t i = 0; i < host_.size(); ++i)
      backend_.to_device(device_[i], host_[i].data(), host_[i].size() * sizeof(float));
  }

 private:
  Backend& backend_;
  std::vector<std::vector<float>> host_;
  std::vector<float*> device_;
};

}  // namespace

std::vector<CheckpointTensor> Trainer::checkpoint_tensors(bool moments) {
  // The whole model's parameter list (names and global shapes), the same on every rank.
  ParameterStore all;
  ModelStage whole(cfg_.model, 0, model_num_units(cfg_.model), all);
  std::vector<CheckpointTensor> out;
  const std::vector<std::pair<std::string, int>> kinds =
      moments ? std::vector<std::pair<std::string, int>>{{"params/", 0}, {"adam_m/", 1}, {"adam_v/", 2}}
              : std::vector<std::pair<std::string, int>>{{"params/", 0}};
  for (const auto& [prefix, kind] : kinds)
    for (const auto& g : all.params()) {
      if (kind != 0 && !g.trained) continue;  // no moments
      CheckpointTensor t;
      t.name = prefix + g.name;
      t.global_shape = g.global_shape;
      if (Parameter* p = params_.find(g.name)) {
        t.shard = p->shard;
        UnitShards* units = sync_->units();
        if (units && p->unit >= 0 && (kind != 0 || units->shards_weights())) {
          // Unit shards: this rank's part of the tensor, written and read where it is (state
          // in no unit is whole on every rank, as below).
          const UnitShards::Piece x = units->piece(*p);
          if (x.hi > x.lo) {
            t.data = kind == 0 ? x.value : kind == 1 ? x.m : x.v;
            if (x.hi - x.lo < p->numel()) {
              t.flat_begin = x.lo - p->offset;
              t.flat_end = x.hi - p->offset;
            }
            t.write = units->first_group() && (kind == 0 ? sync_->counts_in_norm(*p) : sync_->writes_moments(*p));
          }
        } else if (kind == 0 || !zero1()) {
          const Tensor& src = kind == 0 ? p->value : kind == 1 ? p->m : p->v;
          t.data = src.defined() ? src.f32() : nullptr;  // no moments: another rank's copy is updated
          // The first replica writes (of dp x cp: context-parallel ranks hold the same values);
          // an expert-parallel part, the first rank holding it.
          const int writer = p->expert_parallel ? grid_.coords().edp : grid_.comm("dp-cp").rank();
          t.write = writer == 0 && (kind == 0 ? sync_->counts_in_norm(*p) : sync_->writes_moments(*p));
        } else {
          // ZeRO-1: this rank holds the moments of its owned ranges only, and writes /
          // reads exactly that part of the tensor.
          OptimizerShards& shards = *sync_->shards();
          for (const auto& r : shards.ranges()) {
            const int64_t lo = std::max(p->offset, r.lo), hi = std::min(p->offset + p->numel(), r.hi);
            if (lo >= hi) continue;
            t.data = kind == 1 ? shards.m(r, lo) : shards.v(r, lo);
            if (hi - lo < p->numel()) {  // a tensor cut by the range's boundary: its part only
              t.flat_begin = lo - p->offset;
              t.flat_end = hi - p->offset;
            }
            t.write = sync_->writes_moments(*p);
          }
        }
      }
      out.push_back(std::move(t));
    }
  return out;
}

void Trainer::save_checkpoint(const std::string& path, int64_t next_step) {
  if (use_ != TrainerUse::Train) fail("{}: a trainer built for inference holds no optimizer state to save", path);
  CheckpointMeta meta;
  meta.step = next_step;
  meta.samples_seen = next_step * cfg_.train.global_batch;
  meta.tokens_seen = meta.samples_seen * cfg_.train.seq_len;
  meta.seed = cfg_.train.seed;
  meta.config_toml = to_toml(cfg_);
  meta.grid = grid_.shape();
  meta.zero1 = zero1();
  meta.schedule = plan_.schedule.name;
  meta.tokenizer = tokenizer_;
  // Written straight from the live buffers: ZeRO-1 ranks write their moment shards, so
  // a save allocates nothing.
  std::vector<CheckpointTensor> tensors = checkpoint_tensors(true);
  HostStaging staged(backend_, tensors, true);
  write_checkpoint(path, grid_.world().comm(), meta, tensors);
}

int64_t Trainer::load_checkpoint(const std::string& path, bool weights_only) {
  if (!weights_only && use_ != TrainerUse::Train)
    fail("{}: a trainer built for inference loads the weights only (it holds no optimizer state)", path);
  const CheckpointMeta meta = read_checkpoint_meta(path);
  std::vector<CheckpointTensor> tensors = checkpoint_tensors(!weights_only);
  HostStaging staged(backend_, tensors, false);
  read_checkpoint_tensors(path, grid_.world().comm(), tensors);
  staged.copy_in();
  params_.refresh_compute(*pool_, backend_);  // checkpoints hold the f32 master weights
  if (UnitShards* units = sync_->units()) units->refresh_bf16();
  if (weights_only) return 0;
  int64_t samples = 0, tokens = 0;  // what this run's shape implies for the checkpoint's step
  const bool overflow = __builtin_mul_overflow(meta.step, static_cast<int64_t>(cfg_.train.global_batch), &samples) ||
                        __builtin_mul_overflow(samples, static_cast<int64_t>(cfg_.train.seq_len), &tokens);
  if (overflow || meta.samples_seen != samples)
    fail("{}: written with train.global_batch = {}, this run has {}; resume with the same global batch "
         "(or start a new run from its weights with --init)",
         path, meta.step == 0 ? 0 : meta.samples_seen / meta.step, cfg_.train.global_batch);
  if (meta.step > 0 && meta.tokens_seen != tokens)
    fail("{}: written with train.seq_len = {}, this run has {}; resume with the same sequence length "
         "(or start a new run from its weights with --init)",
         path, meta.tokens_seen / std::max<int64_t>(meta.samples_seen, 1), cfg_.train.seq_len);
  return meta.step;
}

}  // namespace pipetrain
