// Single-rank trainer: runs one step as microbatches of forward + backward through
// a Gpt2Stage that holds the whole model, then clips and applies AdamW.
// (The MPMD pipeline executor generalises this to one stage per rank.)
#pragma once
#include <cstdint>
#include <functional>
#include <memory>

#include "pipetrain/core/config.hpp"
#include "pipetrain/core/memory_pool.hpp"
#include "pipetrain/model/gpt2.hpp"
#include "pipetrain/runtime/optimizer.hpp"

namespace pipetrain {

class Backend;

// Fills inputs/targets (count x seq_len, int32, host memory) for global samples
// first .. first+count-1.
using BatchSource = std::function<void(int64_t first, int count, int32_t* inputs, int32_t* targets)>;

struct StepMetrics {
  int step = 0;
  double loss = 0;  // mean token loss of this step's forward pass (before its update)
  double lr = 0;
  double grad_norm = 0;  // before clipping
  double step_time_s = 0;
  double tokens_per_s = 0;
};

class Trainer {
 public:
  Trainer(const Config& cfg, Backend& backend, BatchSource source);
  StepMetrics train_step(int step);
  // Mean loss over `count` samples starting at `first`, no update.
  double evaluate(const BatchSource& source, int64_t first, int count);

  Gpt2Stage& model() { return model_; }
  MemoryPool& pool() { return *pool_; }
  int64_t tokens_per_step() const;
  int microbatch_size() const { return mb_size_; }

 private:
  double run_microbatch(int64_t first_sample, float loss_scale, bool backward);

  Config cfg_;
  Backend& backend_;
  BatchSource source_;
  std::shared_ptr<MemoryPool> pool_;
  Gpt2Stage model_;
  AdamW optimizer_;
  int mb_size_;
  std::vector<int32_t> host_inputs_, host_targets_;
  std::vector<float> host_losses_;
};

}  // namespace pipetrain
