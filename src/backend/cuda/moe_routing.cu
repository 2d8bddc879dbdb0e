// Mixture-of-experts routing on the GPU (Backend::moe_route, moe_router_backward): the rule
// of ../moe_router_rule.hpp, which the CPU compiles too. Four kernels in stream order:
//   score_tokens:   a thread per token: scores, top k, combine weights, lse and Σ scores;
//   rank_by_expert: a block per expert: each choice's place among the expert's in token
//                   order (warp ballots over 32 contiguous chunks, chunk bases from the
//                   chunks' counts: no atomics), the expert's count and mean balance
//                   probability; one more block sums the z-loss;
//   route_offsets:  one thread: the offsets before and after capacity, the load balance;
//   place_rows:     a thread per choice: its sorted row, that row's source and weight.
// Then one copy to the host of the counts and losses, side by side in the scratch (the host
// sizes the exchange and the products from them). Deterministic: every sum in a fixed
// order, in double. Compiled with -fmad=false (src/CMakeLists.txt), as the CPU's rule is
// without contraction.
#include <cstring>
#include <vector>

#include "../moe_router_rule.hpp"
#include "cuda_device.cuh"
#include "cuda_kernels.hpp"

namespace pipetrain::cuda {
namespace {

using namespace router_rule;

constexpr unsigned kRankWarps = 32;

// The scratch a routing uses, carved out of one device block (sizes in elements). What the
// host reads, the summary, is contiguous: losses, chosen, kept, dropped.
struct RouteScratch {
  double *lse, *ssum, *mean_p, *losses;            // (N), (N), (E), {z, load balance}
  int32_t *chosen, *kept, *dropped, *count, *pos;  // (E + 1), (E + 1), (1), (E), (N k)
  static size_t bytes(int N, int E, int k) {
    return sizeof(double) * (2 * size_t(N) + E + 2) + sizeof(int32_t) * (3 * size_t(E) + 3 + size_t(N) * k);
  }
  static size_t summary_bytes(int E) { return 2 * sizeof(double) + sizeof(int32_t) * (2 * size_t(E) + 3); }
  RouteScratch(void* p, int N, int E) {
    auto* d = static_cast<double*>(p);
    lse = d, ssum = d + N, mean_p = d + 2 * size_t(N), losses = mean_p + E;
    chosen = reinterpret_cast<int32_t*>(losses + 2), kept = chosen + E + 1, dropped = kept + E + 1;
    count = dropped + 1, pos = count + E;
  }
};

__global__ void score_tokens_kernel(RoutedArrays out, const float* __restrict__ logits, const float* __restrict__ bias,
                                    int N, RouterSpec spec, double* lse, double* ssum) {
  const int E = spec.experts, k = spec.top_k;
  for (size_t t = grid_index(); t < size_t(N); t += grid_stride()) {
    const float* l = logits + t * E;
    float* s = out.scores + t * E;
    int32_t* chosen = out.expert + t * k;
    lse[t] = score_row(l, E, spec.kind, s);
    if (spec.force_balance)
      choose_round_robin(static_cast<int64_t>(t), E, k, chosen);
    else
      choose_top_k(s, bias, E, k, chosen);
    combine_weights(s, chosen, k, spec.renormalize, out.weight + t * k);
    ssum[t] = spec.kind == RouterKind::Sigmoid ? score_sum(s, E) : 1.0;
  }
}

// Warp w's choices of expert e among [begin, end): counted (pos null) or numbered from
// `first` in order (pos[i] = first + those before i). Returns how many.
__device__ int32_t rank_chunk(const int32_t* expert, int32_t e, size_t begin, size_t end, int32_t first, int32_t* pos) {
  const unsigned lane = threadIdx.x & 31u;
  int32_t n = 0;
  for (size_t base = begin; base < end; base += 32) {
    const size_t i = base + lane;
    const bool mine = i < end && expert[i] == e;
    const unsigned mask = __ballot_sync(0xffffffffu, mine);
    if (mine && pos) pos[i] = first + n + __popc(mask & ((1u << lane) - 1u));
    n += __popc(mask);
  }
  return n;
}

// Block e < E: expert e's places, count and mean balance probability. Block E: the z-loss.
__global__ void rank_by_expert_kernel(const int32_t* __restrict__ expert, const float* __restrict__ scores, int N,
                                      int E, int k, RouterKind kind, RouteScratch s) {
  const int e = static_cast<int>(blockIdx.x);
  double acc = 0;
  if (e == E) {
    for (int t = static_cast<int>(threadIdx.x); t < N; t += blockDim.x) acc += s.lse[t] * s.lse[t] / N;
    acc = block_sum(acc);
    if (threadIdx.x == 0) s.losses[0] = acc;
    return;
  }
  __shared__ int32_t chunk_count[kRankWarps];
  const size_t pairs = size_t(N) * k, chunk = (pairs + kRankWarps - 1) / kRankWarps;
  const unsigned warp = threadIdx.x >> 5;
  const size_t begin = warp * chunk < pairs ? warp * chunk : pairs, end = begin + chunk < pairs ? begin + chunk : pairs;
  const int32_t n = rank_chunk(expert, e, begin, end, 0, nullptr);
  if ((threadIdx.x & 31u) == 0) chunk_count[warp] = n;
  __syncthreads();
  int32_t first = 0, total = 0;
  for (unsigned w = 0; w < kRankWarps; ++w) {
    if (w < warp) first += chunk_count[w];
    total += chunk_count[w];
  }
  rank_chunk(expert, e, begin, end, first, s.pos);
  for (int t = static_cast<int>(threadIdx.x); t < N; t += blockDim.x)
    acc += balance_prob(scores[size_t(t) * E + e], s.ssum[t], kind) / N;
  acc = block_sum(acc);
  if (threadIdx.x == 0) s.count[e] = total, s.mean_p[e] = acc;
}

__global__ void route_offsets_kernel(int N, int E, int k, int cap, int32_t* chosen, RouteScratch s) {
  *s.dropped = offsets_from_counts(s.count, E, cap, s.chosen, s.kept);
  for (int e = 0; e <= E; ++e) chosen[e] = s.chosen[e];
  s.losses[1] = load_balance(s.count, s.mean_p, E, N, k);
}

__global__ void place_rows_kernel(RoutedArrays out, int k, int cap, size_t pairs, RouteScratch s) {
  for (size_t i = grid_index(); i < pairs; i += grid_stride()) {
    const int32_t row = placed_row(s.pos[i], out.expert[i], cap, s.kept);
    out.row[i] = row;
    if (row < 0) continue;
    out.source[row] = static_cast<int32_t>(i / k);
    out.row_weight[row] = out.weight[i];
  }
}

__global__ void router_backward_kernel(float* dlogits, const float* __restrict__ scores,
                                       const int32_t* __restrict__ expert, const float* __restrict__ logits,
                                       const float* __restrict__ dweight, BackwardShape shape) {
  const int E = shape.E, k = shape.k;
  for (size_t t = grid_index(); t < size_t(shape.N); t += grid_stride())
    backward_token({logits + t * E, scores + t * E, dweight + t * k, expert + t * k}, shape, dlogits + t * E);
}

}  // namespace

size_t moe_route_scratch_bytes(int N, int E, int k) { return RouteScratch::bytes(N, E, k); }

RouteCounts moe_route(const Ctx& ctx, const RoutedArrays& out, const float* logits, const float* bias, int N,
                      const RouterSpec& spec, int cap, void* scratch) {
  const int E = spec.experts, k = spec.top_k;
  RouteCounts r;
  r.tokens = N, r.k = k, r.experts = E;
  r.offset.assign(size_t(E) + 1, 0), r.chosen.assign(size_t(E) + 1, 0);
  if (N <= 0) {  // an empty microbatch: no rows, as on the CPU
    PIPETRAIN_CUDA_CHECK(cudaMemsetAsync(out.chosen, 0, sizeof(int32_t) * (size_t(E) + 1), ctx.stream));
    return r;
  }
  const RouteScratch s(scratch, N, E);
  const size_t pairs = size_t(N) * k;
  score_tokens_kernel<<<grid_for(size_t(N), 128, ctx), 128, 0, ctx.stream>>>(out, logits, bias, N, spec, s.lse, s.ssum);
  check_launch("score_tokens");
  rank_by_expert_kernel<<<unsigned(E) + 1, 32 * kRankWarps, 0, ctx.stream>>>(out.expert, out.scores, N, E, k, spec.kind,
                                                                             s);
  check_launch("rank_by_expert");
  route_offsets_kernel<<<1, 1, 0, ctx.stream>>>(N, E, k, cap, out.chosen, s);
  check_launch("route_offsets");
  place_rows_kernel<<<grid_for(pairs, 256, ctx), 256, 0, ctx.stream>>>(out, k, cap, pairs, s);
  check_launch("place_rows");
  std::vector<unsigned char> summary(RouteScratch::summary_bytes(E));
  PIPETRAIN_CUDA_CHECK(cudaMemcpyAsync(summary.data(), s.losses, summary.size(), cudaMemcpyDeviceToHost, ctx.stream));
  PIPETRAIN_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
  const size_t offsets = sizeof(int32_t) * (size_t(E) + 1);
  const unsigned char* at = summary.data();
  std::memcpy(&r.z, at, sizeof(double));
  std::memcpy(&r.load_balance, at + sizeof(double), sizeof(double));
  std::memcpy(r.chosen.data(), at + 2 * sizeof(double), offsets);
  std::memcpy(r.offset.data(), at + 2 * sizeof(double) + offsets, offsets);
  std::memcpy(&r.dropped, at + 2 * sizeof(double) + 2 * offsets, sizeof(int32_t));
  return r;
}

void moe_router_backward(const Ctx& ctx, float* dlogits, const RoutedArrays& r, const float* logits,
                         const float* dweight, int N, const RouterSpec& spec, double scale) {
  if (N <= 0) return;
  const BackwardShape shape{r.chosen, N, spec.experts, spec.top_k, spec, scale};
  router_backward_kernel<<<grid_for(size_t(N), 128, ctx), 128, 0, ctx.stream>>>(dlogits, r.scores, r.expert, logits,
                                                                                dweight, shape);
  check_launch("router_backward");
}

}  // namespace pipetrain::cuda
