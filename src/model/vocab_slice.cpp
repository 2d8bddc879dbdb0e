// VocabSlice (pipetrain/model/vocab_slice.hpp). The loss reuses the tensor-parallel
// cross-entropy's phases (Backend::crossentropy_local_*): a slice's log-sum-exp is its row
// maximum plus the log of its sum of exponentials, and with the global log-sum-exp as the
// "row maximum" and 1 as the "sum", crossentropy_finish gives the loss and the softmax's
// gradient of the slice's columns.
#include "pipetrain/model/vocab_slice.hpp"

#include <cmath>
#include <limits>
#include <vector>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/model/embedding.hpp"
#include "pipetrain/model/linear.hpp"
#include "pipetrain/model/precision.hpp"

namespace pipetrain {

using namespace layer_util;

VocabSlice::VocabSlice(const ModelConfig& cfg, ParameterStore& params, TensorParallel slice)
    : C_(cfg.d_model),
      V_(cfg.vocab_size),
      begin_(cfg.padded_vocab() / slice.size * slice.rank),
      end_(cfg.padded_vocab() / slice.size * (slice.rank + 1)),
      wte_(declare_wte(cfg, params, slice)),
      head_(cfg.tied() ? wte_ : declare_lm_head(cfg, params, slice)) {
  if (cfg.padded_vocab() % slice.size != 0)
    fail("vocabulary parallelism: {} slices do not divide the padded vocabulary of {}", slice.size, cfg.padded_vocab());
}

std::vector<Parameter*> VocabSlice::parameters() {
  if (&head_ == &wte_) return {&wte_};
  return {&wte_, &head_};
}

void VocabSlice::embed_forward(const MicrobatchContext& ctx, const Tensor& tokens, const Tensor& out) const {
  const int N = static_cast<int>(tokens.numel());
  if (wte_.compute_bf16.defined())
    ctx.backend->embedding_lookup(out.f32(), tokens.i32(), wte_.compute_bf16.bf16_data(), begin_, end_, N, C_);
  else
    ctx.backend->embedding_lookup(out.f32(), tokens.i32(), wte_.value.f32(), begin_, end_, N, C_);
}

void VocabSlice::embed_backward(const MicrobatchContext& ctx, const Tensor& tokens, const Tensor& dout) {
  const Tensor d = working_f32(ctx, dout);
  ctx.backend->embedding_scatter(wte_.grad.f32(), d.f32(), tokens.i32(), begin_, end_, static_cast<int>(tokens.numel()),
                                 C_);
}

VocabOutputStash VocabSlice::output_forward(const MicrobatchContext& ctx, const Tensor& x, const Tensor& stats,
                                            const Tensor* partials) const {
  Backend& be = *ctx.backend;
  const int N = static_cast<int>(x.shape()[0]), Vl = end_ - begin_;
  VocabOutputStash s{x, Tensor::empty(*ctx.pool, {N, Vl})};
  linear_forward(ctx, s.logits, x, head_, nullptr);
  float* lse = stats.f32();
  float* target = lse + N;
  Tensor sums = Tensor::empty(*ctx.pool, {N});
  be.crossentropy_local_max(lse, s.logits.f32(), N, Vl, begin_, V_);
  be.crossentropy_local_sums(sums.f32(), target, s.logits.f32(), lse, ctx.targets.i32(), N, Vl, begin_, V_);
  if (partials) write_partials(ctx, s, lse, sums.f32(), *partials);
  for (int n = 0; n < N; ++n)  // a slice of padding only has no columns: -inf
    if (std::isfinite(lse[n])) lse[n] += std::log(sums.f32()[n]);
  return s;
}

// Row n: [m, s, a, b] with m the slice's maximum, s its sum of exp(logit - m), b = W[t] (the
// target's row where it is in the slice, else 0) and a = P W with P = exp(logits - m): from
// D = P - onehot(t), one product, a = D W + b.
void VocabSlice::write_partials(const MicrobatchContext& ctx, const VocabOutputStash& s, const float* max,
                                const float* sums, const Tensor& partials) const {
  Backend& be = *ctx.backend;
  const int N = static_cast<int>(s.x.shape()[0]), Vl = end_ - begin_;
  if (partials.shape() != std::vector<int64_t>{N, 2 + 2 * static_cast<int64_t>(C_)})
    fail("vocabulary slice: partials are {}, not ({}, {})", partials.describe(), N, 2 + 2 * C_);
  Tensor d = Tensor::empty(*ctx.pool, {N, Vl});
  be.copy(d.raw(), s.logits.raw(), s.logits.bytes());
  Tensor ones = Tensor::empty(*ctx.pool, {N}), unused = Tensor::empty(*ctx.pool, {N});
  be.fill(ones.f32(), 1.0f, static_cast<size_t>(N));
  Tensor target = Tensor::empty(*ctx.pool, {N});  // the target logits relative to m: only the loss reads them
  be.fill(target.f32(), 0.0f, static_cast<size_t>(N));
  be.crossentropy_finish(unused.f32(), d.f32(), max, ones.f32(), target.f32(), ctx.targets.i32(), N, Vl, begin_, V_,
                         1.0f);
  Tensor dw = Tensor::empty(*ctx.pool, {N, C_}), wt = Tensor::empty(*ctx.pool, {N, C_});
  linear_backward_input(ctx, dw, store(ctx, d), head_);
  if (head_.compute_bf16.defined())
    be.embedding_lookup(wt.f32(), ctx.targets.i32(), head_.compute_bf16.bf16_data(), begin_, end_, N, C_);
  else
    be.embedding_lookup(wt.f32(), ctx.targets.i32(), head_.value.f32(), begin_, end_, N, C_);
  const int64_t width = 2 + 2 * static_cast<int64_t>(C_);
  float* out = partials.f32();
  for (int64_t n = 0; n < N; ++n) {
    float* row = out + n * width;
    const float* a = dw.f32() + n * C_;
    const float* b = wt.f32() + n * C_;
    row[0] = max[n];
    row[1] = std::isfinite(max[n]) ? sums[n] : 0.0f;
    for (int64_t j = 0; j < C_; ++j) row[2 + j] = a[j] + b[j], row[2 + C_ + j] = b[j];
  }
}

void VocabSlice::hidden_grad(const MicrobatchContext& ctx, const Tensor& merged, const Tensor& dx) {
  const int64_t N = dx.shape()[0], C = dx.shape()[1], width = 2 + 2 * C;
  if (merged.shape() != std::vector<int64_t>{N, width})
    fail("vocabulary parallelism: merged partials are {}, not ({}, {})", merged.describe(), N, width);
  const float* in = merged.f32();
  float* out = dx.f32();
  for (int64_t n = 0; n < N; ++n) {
    const float* row = in + n * width;
    const float a = ctx.loss_scale / row[1];
    for (int64_t j = 0; j < C; ++j) out[n * C + j] = a * row[2 + j] - ctx.loss_scale * row[2 + C + j];
  }
}

void VocabSlice::output_backward(const MicrobatchContext& ctx, VocabOutputStash& s, const Tensor& all_stats, int slices,
                                 const Tensor& losses) {
  const int N = static_cast<int>(s.x.shape()[0]), Vl = end_ - begin_;
  Tensor global = Tensor::empty(*ctx.pool, {3, N});  // log-sum-exp, 1, target logit
  float* lse = global.f32();
  float* ones = lse + N;
  float* target = ones + N;
  const float* st = all_stats.f32();
  for (int n = 0; n < N; ++n) {
    // log sum_r exp(lse_r), from the largest (slices of padding contribute -inf).
    float top = -std::numeric_limits<float>::infinity();
    for (int r = 0; r < slices; ++r) top = std::max(top, st[static_cast<size_t>(r) * 2 * N + n]);
    double sum = 0, t = 0;
    for (int r = 0; r < slices; ++r) {
      const float l = st[static_cast<size_t>(r) * 2 * N + n];
      if (std::isfinite(l)) sum += std::exp(static_cast<double>(l) - top);
      t += st[static_cast<size_t>(r) * 2 * N + N + n];
    }
    lse[n] = top + static_cast<float>(std::log(sum));
    ones[n] = 1.0f;
    target[n] = static_cast<float>(t);
  }
  ctx.backend->crossentropy_finish(losses.f32(), s.logits.f32(), lse, ones, target, ctx.targets.i32(), N, Vl, begin_,
                                   V_, ctx.loss_scale);
  if (ctx.loss_scale == 0) return;
  linear_backward_weight(ctx, store(ctx, s.logits), s.x, head_, nullptr);
}

}  // namespace pipetrain
