// Sequence parallelism's row conversions (pipetrain/model/sequence_parallel.hpp).
#include "pipetrain/model/sequence_parallel.hpp"

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/comm/communicator.hpp"
#include "pipetrain/core/error.hpp"

namespace pipetrain::layer_util {

bool sequence_sharded(const MicrobatchContext& ctx) {
  return ctx.sequence_parallel && ctx.tp && ctx.tp->size() > 1 && !ctx.kv;
}

bool takes_rows(const MicrobatchContext& ctx, const Layer& layer) {
  return sequence_sharded(ctx) && layer.row_sharded();
}

int local_rows(const MicrobatchContext& ctx) {
  const int N = ctx.B * ctx.T;
  if (!sequence_sharded(ctx)) return N;
  if (N % ctx.tp->size() != 0)
    fail("sequence parallelism: {} rows of a microbatch do not split over {} tensor-parallel ranks", N, ctx.tp->size());
  return N / ctx.tp->size();
}

Tensor gather_rows(const MicrobatchContext& ctx, const Tensor& mine) {
  const int64_t n = mine.shape()[0], C = mine.numel() / n;
  Tensor whole = Tensor::empty(*ctx.pool, {n * ctx.tp->size(), C}, mine.dtype());
  ctx.tp->all_gather(mine, whole, ctx.backend->stream())->wait_on(ctx.backend->stream());
  return whole;
}

Tensor reduce_scatter_rows(const MicrobatchContext& ctx, const Tensor& partial) {
  const int64_t N = partial.shape()[0], C = partial.numel() / N;
  Tensor mine = Tensor::empty(*ctx.pool, {N / ctx.tp->size(), C});
  ctx.tp->reduce_scatter_sum(partial, mine, ctx.backend->stream())->wait_on(ctx.backend->stream());
  return mine;
}

Tensor to_rows(const MicrobatchContext& ctx, const Tensor& x, bool from_rows, bool to_rows) {
  if (from_rows == to_rows || !x.defined()) return x;
  if (!to_rows) return gather_rows(ctx, x);
  const int64_t N = x.shape()[0], C = x.numel() / N, n = N / ctx.tp->size();
  Tensor mine = Tensor::empty(*ctx.pool, {n, C}, x.dtype());
  const size_t bytes = static_cast<size_t>(mine.bytes());
  ctx.backend->copy(mine.raw(), static_cast<const char*>(x.raw()) + bytes * static_cast<size_t>(ctx.tp->rank()), bytes);
  return mine;
}

Tensor whole_rows(const MicrobatchContext& ctx, const Tensor& x) {
  return sequence_sharded(ctx) ? gather_rows(ctx, x) : x;
}

Tensor finish_row_parallel(const MicrobatchContext& ctx, const Tensor& partial) {
  if (!ctx.tp || ctx.tp->size() == 1) return partial;
  if (sequence_sharded(ctx)) return reduce_scatter_rows(ctx, partial);
  ctx.tp->allreduce_sum(partial, ctx.backend->stream())->wait_on(ctx.backend->stream());
  return partial;
}

void replicated_grads(const MicrobatchContext& ctx, std::initializer_list<Parameter*> params,
                      const std::function<void(const std::vector<float*>& grads)>& accumulate) {
  std::vector<float*> grads;
  if (!sequence_sharded(ctx)) {
    for (Parameter* p : params) grads.push_back(p->grad.f32());
    accumulate(grads);
    return;
  }
  int64_t total = 0;
  for (const Parameter* p : params) total += p->numel();
  const Tensor scratch = Tensor::empty(*ctx.pool, {total});
  ctx.backend->fill(scratch.f32(), 0.0f, static_cast<size_t>(total));
  int64_t at = 0;
  for (const Parameter* p : params) grads.push_back(scratch.f32() + at), at += p->numel();
  accumulate(grads);
  ctx.tp->allreduce_sum(scratch, ctx.backend->stream())->wait_on(ctx.backend->stream());
  at = 0;
  for (Parameter* p : params) {
    ctx.backend->accumulate(p->grad.f32(), scratch.f32() + at, static_cast<size_t>(p->numel()));
    at += p->numel();
  }
}

}  // namespace pipetrain::layer_util
