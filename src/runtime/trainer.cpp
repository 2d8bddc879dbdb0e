#include "pipetrain/runtime/trainer.hpp"

#include <chrono>
#include <cmath>
#include <utility>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/core/error.hpp"

namespace pipetrain {

Trainer::Trainer(const Config& cfg, Backend& backend, BatchSource source)
    : cfg_(cfg),
      backend_(backend),
      source_(std::move(source)),
      pool_(MemoryPool::create(backend)),
      model_(Gpt2Stage::whole_model(cfg.model)),
      optimizer_(cfg.train),
      mb_size_(cfg.train.global_batch / (cfg.parallel.dp * cfg.train.microbatches)) {
  const size_t n = static_cast<size_t>(mb_size_) * static_cast<size_t>(cfg.train.seq_len);
  host_inputs_.resize(n);
  host_targets_.resize(n);
  host_losses_.resize(n);
  model_.params().allocate(*pool_, backend_);
  model_.params().initialize(cfg.train.seed, backend_);
}

int64_t Trainer::tokens_per_step() const {
  return static_cast<int64_t>(cfg_.train.global_batch) * cfg_.train.seq_len;
}

double Trainer::run_microbatch(int64_t first_sample, float loss_scale, bool backward) {
  const int B = mb_size_, T = cfg_.train.seq_len, N = B * T;
  source_(first_sample, B, host_inputs_.data(), host_targets_.data());
  MicrobatchContext ctx;
  ctx.backend = &backend_;
  ctx.pool = pool_.get();
  ctx.B = B;
  ctx.T = T;
  ctx.loss_scale = backward ? loss_scale : 0.0f;
  ctx.tokens = Tensor::empty(*pool_, {N}, DType::I32);
  ctx.targets = Tensor::empty(*pool_, {N}, DType::I32);
  backend_.to_device(ctx.tokens.raw(), host_inputs_.data(), ctx.tokens.bytes());
  backend_.to_device(ctx.targets.raw(), host_targets_.data(), ctx.targets.bytes());

  auto& layers = model_.layers();
  std::vector<std::unique_ptr<Stash>> stashes(layers.size());
  Tensor x;
  for (size_t i = 0; i < layers.size(); ++i) x = layers[i]->forward(ctx, x, stashes[i]);
  backend_.to_host(host_losses_.data(), x.raw(), x.bytes());
  double loss_sum = 0.0;
  for (int i = 0; i < N; ++i) loss_sum += host_losses_[static_cast<size_t>(i)];
  x = {};
  if (backward) {
    Tensor dy;
    for (size_t i = layers.size(); i-- > 0;) {
      dy = layers[i]->backward(ctx, dy, *stashes[i]);
      stashes[i].reset();  // activations go back to the pool as soon as possible
    }
  }
  return loss_sum;
}

StepMetrics Trainer::train_step(int step) {
  const auto t0 = std::chrono::steady_clock::now();
  auto& params = model_.params();
  params.zero_grads(backend_);
  const int64_t step_tokens = tokens_per_step();
  const float loss_scale = 1.0f / static_cast<float>(step_tokens);
  const int64_t first = static_cast<int64_t>(step) * cfg_.train.global_batch;
  double loss_sum = 0.0;
  for (int m = 0; m < cfg_.train.microbatches; ++m)
    loss_sum += run_microbatch(first + static_cast<int64_t>(m) * mb_size_, loss_scale, true);

  StepMetrics out;
  out.step = step;
  out.loss = loss_sum / static_cast<double>(step_tokens);
  const double sq = backend_.sum_squares(params.grads().f32(), static_cast<size_t>(params.numel()));
  out.grad_norm = std::sqrt(sq);
  if (!std::isfinite(out.loss) || !std::isfinite(out.grad_norm))
    fail("step {}: non-finite {} ({}); stopping before the update", step,
         std::isfinite(out.loss) ? "gradient norm" : "loss",
         std::isfinite(out.loss) ? out.grad_norm : out.loss);
  out.lr = learning_rate(cfg_.train, step);
  optimizer_.step(params, backend_, step + 1, out.lr, clip_scale(out.grad_norm, cfg_.train.grad_clip));
  out.step_time_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  out.tokens_per_s = static_cast<double>(step_tokens) / out.step_time_s;
  return out;
}

double Trainer::evaluate(const BatchSource& source, int64_t first, int count) {
  BatchSource saved = std::exchange(source_, source);
  double sum = 0.0;
  int done = 0;
  while (done + mb_size_ <= count) {
    sum += run_microbatch(first + done, 0.0f, false);
    done += mb_size_;
  }
  source_ = std::move(saved);
  if (done == 0) fail("evaluation needs at least {} samples, got {}", mb_size_, count);
  return sum / (static_cast<double>(done) * cfg_.train.seq_len);
}

}  // namespace pipetrain
