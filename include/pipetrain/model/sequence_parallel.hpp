// Sequence parallelism (parallel.sequence_parallel; Megatron-LM's): under tensor
// parallelism, the activations between the tensor-parallel products hold only this rank's
// share of the microbatch's rows (tokens): rank r of tp holds rows [r N/tp, (r+1) N/tp) of
// the B*T rows. Layers that work so (the dense blocks' halves: Layer::row_sharded) run their
// norms and residuals on those rows, all-gather the normalized rows before their column-
// parallel products and reduce-scatter their row-parallel products' partial sums; the
// gradients of their replicated parameters (norm weights) computed from a rank's rows are
// summed over the tp ranks. Every other layer sees whole, replicated rows as without
// sequence parallelism, and to_rows converts at the boundaries (executor, block pairs).
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <vector>

#include "pipetrain/model/layer.hpp"

namespace pipetrain::layer_util {

// Whether this microbatch runs sequence-parallel (ctx.sequence_parallel with tp > 1;
// never while generating).
bool sequence_sharded(const MicrobatchContext& ctx);
// Whether `layer` takes and returns this rank's rows here.
bool takes_rows(const MicrobatchContext& ctx, const Layer& layer);
// This rank's rows: B*T / tp under sequence parallelism, else B*T.
int local_rows(const MicrobatchContext& ctx);
// Every rank's rows (n, C) -> the microbatch's (N, C), in x's dtype.
Tensor gather_rows(const MicrobatchContext& ctx, const Tensor& mine);
// This rank's rows of the sum over the tp ranks of `partial` (N, C) f32 -> (n, C) f32.
Tensor reduce_scatter_rows(const MicrobatchContext& ctx, const Tensor& partial);
// An activation or its gradient from one form to the other: whole -> this rank's rows is
// a copy of them (whole rows are the same on every tp rank); rows -> whole an all-gather.
// In a backward pass the same two conversions apply in the same direction: the gradient
// of a slice is the gather of the slices' gradients, and that of a gather, whose users sum
// their gradients over tp, is this rank's rows of the sum.
Tensor to_rows(const MicrobatchContext& ctx, const Tensor& x, bool from_rows, bool to_rows);

// The column-parallel products' input: x's rows gathered under sequence parallelism, else x.
Tensor whole_rows(const MicrobatchContext& ctx, const Tensor& x);
// The row-parallel products' partial sums `partial` (N, C, f32) finished: summed over the
// tp ranks, all of them (an all-reduce) or, under sequence parallelism, this rank's rows
// (a reduce-scatter). Without tensor parallelism `partial` itself.
Tensor finish_row_parallel(const MicrobatchContext& ctx, const Tensor& partial);
// Gradients of replicated parameters (norm weights) that `accumulate` adds from this
// rank's rows: under sequence parallelism into zeroed scratch (one pointer per parameter,
// in order), summed over the tp ranks, then added to the parameters' gradients; otherwise
// straight into the gradients.
void replicated_grads(const MicrobatchContext& ctx, std::initializer_list<Parameter*> params,
                      const std::function<void(const std::vector<float*>& grads)>& accumulate);

}  // namespace pipetrain::layer_util
