// CudnnAttention (cudnn_attention.hpp): the operation graphs of docs/gpu-cudnn-attention.md
// built descriptor by descriptor (§3 forward, §4 backward; UIDs, layouts and types of §1),
// the engine choice of §5 (heuristics mode A, the first configuration whose plan finalizes),
// a plan per shape and pass built at its first use and kept, and the runs.
//
// Every cuDNN status is checked. While a plan is built a failure is a refusal: one line on
// stderr per shape and pass, and the flash kernels run it. While a plan runs, a failure
// throws Error naming the call.
#include "cudnn_attention.hpp"

#include <cuda_runtime.h>
#include <cudnn_graph.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cuda_kernels.hpp"
#include "cudnn_loader.hpp"
#include "pipetrain/core/error.hpp"

namespace pipetrain::cuda {

size_t CudnnAttentionStash::bytes() const { return out.bytes() + stats.bytes(); }

namespace {

// ---- statuses and descriptors ----

// cuDNN said no while a plan was built (the reason, for the line printed before the flash
// kernels take the shape).
struct Refusal {
  std::string why;
};

// cuDNN's last error message on one line, in parentheses after a space; empty when it has none.
std::string last_error() {
  std::array<char, 512> last{};
  cudnn().cudnnGetLastErrorString(last.data(), last.size());
  last.back() = '\0';
  std::string message = last.data();
  std::replace(message.begin(), message.end(), '\n', ' ');
  return message.empty() ? message : " (" + message + ")";
}

// "CALL: CUDNN_STATUS_... (cuDNN's last error message)".
std::string describe(const std::string& call, cudnnStatus_t status) {
  return fmt::format("{}: {}{}", call, cudnn().cudnnGetErrorString(status), last_error());
}

void check(cudnnStatus_t status, const std::string& call) {
  if (status != CUDNN_STATUS_SUCCESS) throw Refusal{describe(call, status)};
}

// One backend descriptor, destroyed with its owner; `what` names it in errors.
class Desc {
 public:
  Desc() = default;
  Desc(cudnnBackendDescriptorType_t type, std::string what) : what_(std::move(what)) {
    check(cudnn().cudnnBackendCreateDescriptor(type, &d_), "cudnnBackendCreateDescriptor(" + what_ + ")");
  }
  Desc(Desc&& o) noexcept : d_(std::exchange(o.d_, nullptr)), what_(std::move(o.what_)) {}
  Desc& operator=(Desc&& o) noexcept {
    std::swap(d_, o.d_);
    std::swap(what_, o.what_);
    return *this;
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  ~Desc() {
    if (d_ != nullptr) (void)cudnn().cudnnBackendDestroyDescriptor(d_);
  }

  cudnnBackendDescriptor_t get() const { return d_; }
  void set_array(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, size_t n, const void* values) {
    check(cudnn().cudnnBackendSetAttribute(d_, name, type, static_cast<int64_t>(n), values),
          fmt::format("cudnnBackendSetAttribute({}, attribute {})", what_, static_cast<int>(name)));
  }
  template <class T>
  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, const T& value) {
    set_array(name, type, 1, &value);
  }
  void finalize() { check(cudnn().cudnnBackendFinalize(d_), "cudnnBackendFinalize(" + what_ + ")"); }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
  std::string what_;
};

// Descriptors that must live as long as a plan (cuDNN refers to them), destroyed newest first.
class Keep {
 public:
  Keep() = default;
  Keep(Keep&&) = default;
  Keep& operator=(Keep&&) = default;
  ~Keep() {
    while (!all_.empty()) all_.pop_back();
  }
  cudnnBackendDescriptor_t add(Desc d) {
    all_.push_back(std::move(d));
    return all_.back().get();
  }

 private:
  std::vector<Desc> all_;
};

// A finalized execution plan and what it refers to.
struct Plan {
  Keep keep;  // tensors, operations, the operation graph, the chosen engine configuration
  Desc plan;
  int64_t workspace = 0;  // bytes
};

// ---- shapes ----

// What a plan is built for. The rest of what the graphs depend on follows from it: causal,
// bf16 input and output with f32 statistics, the strides of packed qkv rows (C + 2 NKV hs
// wide) and of (B, T, C) rows, the scale 1/sqrt(hs) (a by-value scalar, given at each run);
// cuDNN's version and the device are one per CudnnAttention.
struct Key {
  int B, T, NH, NKV, hs;
  auto operator<=>(const Key&) const = default;
};

enum Pass { kForward = 0, kBackward = 1 };

using Dims = std::array<int64_t, 4>;
struct Layout {
  Dims dims, strides;
};

// Every tensor's [b, h, s, d] view (§1): B batch, H = NH query heads, G = NKV key/value heads,
// T tokens, D = hs, C = H D, W = C + 2 G D the qkv row.
struct Layouts {
  Layout q, kt, kv, o, rowvec, s, st, heads;
  explicit Layouts(const Key& k) {
    const int64_t B = k.B, H = k.NH, G = k.NKV, T = k.T, D = k.hs, C = H * D, W = C + 2 * G * D;
    q = {{B, H, T, D}, {T * W, D, W, 1}};          // Q and dQ in (dq)kv rows
    kt = {{B, G, D, T}, {T * W, D, 1, W}};         // K (and V in backward) transposed, in place
    kv = {{B, G, T, D}, {T * W, D, W, 1}};         // V, dK and dV in (dq)kv rows
    o = {{B, H, T, D}, {T * C, D, C, 1}};          // O and dO: (B, T, C) rows
    rowvec = {{B, H, T, 1}, {H * T, T, 1, 1}};     // the stats, one per query row
    s = {{B, H, T, T}, {H * T * T, T * T, T, 1}};  // scores and probabilities
    st = {{B, H, T, T}, {H * T * T, T * T, 1, T}};
    heads = {{B, H, T, D}, {H * T * D, T * D, D, 1}};  // per query head, row-major
  }
};

// UIDs of the tensors the runs give (§1); virtual ones are numbered from 1000.
enum Uid : int64_t {
  kQ = 1,
  kK = 2,
  kV = 3,
  kO = 4,
  kStats = 5,
  kScale = 6,
  kNegInf = 7,
  kOne = 8,
  kSoftmaxSum = 9,
  kDqAccum = 10,
  kDO = 101,
  kDQ = 102,
  kDK = 103,
  kDV = 104
};

// ---- building a graph ----

using Td = cudnnBackendDescriptor_t;  // a tensor descriptor the graph keeps
constexpr cudnnDataType_t kF32 = CUDNN_DATA_FLOAT, kBf16 = CUDNN_DATA_BFLOAT16;

class Graph {
 public:
  Td tensor(int64_t uid, cudnnDataType_t type, const Layout& l) { return make(uid, type, l, false, false); }
  Td virt(cudnnDataType_t type, const Layout& l) { return make(next_uid_++, type, l, true, false); }
  // A by-value f32 (§8 question 1: rank 4, {1, 1, 1, 1}; cuDNN 9.19 refuses a rank-1 scalar
  // beside rank-4 tensors at the pointwise operation's finalize).
  Td scalar(int64_t uid) { return make(uid, kF32, {{1, 1, 1, 1}, {1, 1, 1, 1}}, false, true); }

  void pointwise(cudnnPointwiseMode_t mode, Td x, Td b, Td y, Td t = nullptr, cudnnDataType_t prec = kF32,
                 int64_t axis = -1) {
    Desc pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, fmt::format("pointwise mode {}", static_cast<int>(mode)));
    pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, mode);
    pw.set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, prec);
    if (axis >= 0) pw.set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, axis);
    pw.finalize();
    Desc op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR,
            fmt::format("pointwise operation {}", static_cast<int>(mode)));
    const Td desc = pw.get();
    const float one = 1.0f;
    op.set(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, desc);
    op.set(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, x);
    if (b != nullptr) op.set(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, b);
    if (t != nullptr) op.set(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, t);
    op.set(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, y);
    op.set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, one);
    op.set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, one);
    op.finalize();
    keep_.add(std::move(pw));
    ops_.push_back(keep_.add(std::move(op)));
  }
  // mode(x, b) (b null: unary) into a new virtual tensor, computed in f32.
  Td pw(cudnnPointwiseMode_t mode, Td x, Td b, cudnnDataType_t type, const Layout& l) {
    const Td y = virt(type, l);
    pointwise(mode, x, b, y);
    return y;
  }
  void matmul(Td a, Td b, Td c) {
    Desc mm(CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul");
    mm.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, kF32);
    mm.finalize();
    Desc op(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul operation");
    const Td desc = mm.get();
    op.set(CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, a);
    op.set(CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, b);
    op.set(CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, c);
    op.set(CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, desc);
    op.finalize();
    keep_.add(std::move(mm));
    ops_.push_back(keep_.add(std::move(op)));
  }
  // y = the reduction of x over the axes where y's dimension is 1 (or H -> G on the heads).
  void reduction(cudnnReduceTensorOp_t mode, Td x, Td y) {
    Desc red(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction");
    red.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, mode);
    red.set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, kF32);
    red.finalize();
    Desc op(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "reduction operation");
    const Td desc = red.get();
    op.set(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, x);
    op.set(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, y);
    op.set(CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, desc);
    op.finalize();
    keep_.add(std::move(red));
    ops_.push_back(keep_.add(std::move(op)));
  }
  void reshape(Td x, Td y) {
    Desc op(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "reshape operation");
    op.set(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, x);
    op.set(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, y);
    op.finalize();
    ops_.push_back(keep_.add(std::move(op)));
  }
  // The operation graph over every operation in order, and its plan (§5).
  std::unique_ptr<Plan> finish(cudnnHandle_t handle) &&;

 private:
  Td make(int64_t uid, cudnnDataType_t type, const Layout& l, bool is_virtual, bool by_value) {
    Desc t(CUDNN_BACKEND_TENSOR_DESCRIPTOR, fmt::format("tensor {}", uid));
    const int64_t alignment = 16;
    t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, type);
    t.set_array(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, l.dims.size(), l.dims.data());
    t.set_array(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, l.strides.size(), l.strides.data());
    t.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, uid);
    t.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, alignment);
    t.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, is_virtual);
    if (by_value) t.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, by_value);
    t.finalize();
    return keep_.add(std::move(t));
  }

  Keep keep_;
  std::vector<Td> ops_;
  int64_t next_uid_ = 1000;
};

// The engine configurations cuDNN's heuristics (mode A) offer for a finalized graph, best first.
std::vector<Desc> engine_configs(Td graph) {
  Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "engine heuristics");
  heur.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, graph);
  heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, CUDNN_HEUR_MODE_A);
  heur.finalize();
  int64_t n = 0;
  check(cudnn().cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                         &n, nullptr),
        "cudnnBackendGetAttribute(engine heuristics, results count)");
  if (n <= 0) throw Refusal{"cuDNN's heuristics (mode A) offer no engine for the graph" + last_error()};
  std::vector<Desc> configs;
  std::vector<Td> raw;
  for (int64_t i = 0; i < n; ++i) {
    configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine configuration");
    raw.push_back(configs.back().get());
  }
  int64_t got = 0;
  check(cudnn().cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n,
                                         &got, raw.data()),
        "cudnnBackendGetAttribute(engine heuristics, results)");
  configs.erase(configs.begin() + std::clamp<int64_t>(got, 0, n), configs.end());
  if (configs.empty())
    throw Refusal{fmt::format("none of the {} engine configurations cuDNN's heuristics (mode A) offer is supported{}",
                              n, last_error())};
  return configs;
}

std::unique_ptr<Plan> Graph::finish(cudnnHandle_t handle) && {
  Desc graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, handle);
  graph.set_array(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, ops_.size(), ops_.data());
  graph.finalize();
  auto p = std::make_unique<Plan>();
  p->keep = std::move(keep_);
  std::vector<Desc> configs = engine_configs(p->keep.add(std::move(graph)));
  std::string last;
  for (Desc& config : configs) {  // the first whose plan finalizes (the frontend's build_plans)
    Desc plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "execution plan");
    const Td cfg = config.get();
    plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, handle);
    plan.set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, cfg);
    const cudnnStatus_t status = cudnn().cudnnBackendFinalize(plan.get());
    if (status != CUDNN_STATUS_SUCCESS) {
      last = describe("cudnnBackendFinalize(execution plan)", status);
      continue;
    }
    int64_t count = 0;
    check(cudnn().cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                           &count, &p->workspace),
          "cudnnBackendGetAttribute(execution plan, workspace size)");
    p->keep.add(std::move(config));
    p->plan = std::move(plan);
    return p;
  }
  throw Refusal{
      fmt::format("none of the {} engine configurations offered finalizes a plan; the last: {}", configs.size(), last)};
}

// ---- the graphs ----

// Ops 1-6 of §3 (4-9 of §4): s = scale Q K^T, -inf (or lowest()) above the diagonal.
Td masked_scores(Graph& g, const Layouts& L, Td q, Td kt, Td scale, Td neg_inf) {
  const Td s1 = g.virt(kF32, L.s);
  g.matmul(q, kt, s1);
  const Td s2 = g.pw(CUDNN_POINTWISE_MUL, s1, scale, kF32, L.s);
  const Td row = g.virt(CUDNN_DATA_INT32, L.s), col = g.virt(CUDNN_DATA_INT32, L.s);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, s2, nullptr, row, nullptr, CUDNN_DATA_INT32, 2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, s2, nullptr, col, nullptr, CUDNN_DATA_INT32, 3);
  const Td keep = g.virt(CUDNN_DATA_BOOLEAN, L.s);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, row, col, keep, nullptr, CUDNN_DATA_BOOLEAN);
  const Td masked = g.virt(kF32, L.s);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, s2, neg_inf, masked, keep);  // keep ? s2 : neg_inf
  return masked;
}

// c = a b per query head; with fewer key/value heads (c has G of them), per query head into
// bf16 and summed over each group of H / G heads (§4 ops 13b, 19b).
void group_matmul(Graph& g, const Key& k, const Layouts& L, Td a, Td b, Td c) {
  if (k.NKV == k.NH) return g.matmul(a, b, c);
  const Td per_head = g.virt(kBf16, L.heads);
  g.matmul(a, b, per_head);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, per_head, c);
}

// §3: O = softmax(masked scores) V, STATS = max + log(sum exp(s - max)).
std::unique_ptr<Plan> forward_plan(cudnnHandle_t handle, const Key& k) {
  const Layouts L(k);
  Graph g;
  const Td q = g.tensor(kQ, kBf16, L.q), kt = g.tensor(kK, kBf16, L.kt), v = g.tensor(kV, kBf16, L.kv);
  const Td o = g.tensor(kO, kBf16, L.o), stats = g.tensor(kStats, kF32, L.rowvec);
  const Td scale = g.scalar(kScale), neg_inf = g.scalar(kNegInf);
  const Td s = masked_scores(g, L, q, kt, scale, neg_inf);
  const Td m = g.virt(kF32, L.rowvec);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, s, m);
  const Td shifted = g.pw(CUDNN_POINTWISE_SUB, s, m, kF32, L.s);
  const Td e = g.pw(CUDNN_POINTWISE_EXP, shifted, nullptr, kF32, L.s);
  const Td z = g.virt(kF32, L.rowvec);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, z);
  const Td log_z = g.pw(CUDNN_POINTWISE_LOG, z, nullptr, kF32, L.rowvec);
  g.pointwise(CUDNN_POINTWISE_ADD, m, log_z, stats);
  const Td p = g.pw(CUDNN_POINTWISE_DIV, e, z, kBf16, L.s);  // bmm2's A in bf16, as the backend requires
  g.matmul(p, v, o);
  return std::move(g).finish(handle);
}

// §4: dV = P^T dO, dS = scale P (dO V^T - rowsum(dO O)), dK = dS^T Q, dQ = dS K. mul_dp: the
// MUL of dP by one the frontend emitted through v1.11 (§8 question 3: kept before cuDNN 9.5).
std::unique_ptr<Plan> backward_plan(cudnnHandle_t handle, const Key& k, bool mul_dp) {
  const Layouts L(k);
  Graph g;
  const Td q = g.tensor(kQ, kBf16, L.q), kt = g.tensor(kK, kBf16, L.kt), vt = g.tensor(kV, kBf16, L.kt);
  const Td o = g.tensor(kO, kBf16, L.o), dout = g.tensor(kDO, kBf16, L.o), stats = g.tensor(kStats, kF32, L.rowvec);
  const Td dq = g.tensor(kDQ, kBf16, L.q), dk = g.tensor(kDK, kBf16, L.kv), dv = g.tensor(kDV, kBf16, L.kv);
  const Td softmax_sum = g.tensor(kSoftmaxSum, kF32, L.rowvec), dq_accum = g.tensor(kDqAccum, kF32, L.heads);
  const Td scale = g.scalar(kScale), neg_inf = g.scalar(kNegInf), one = g.scalar(kOne);
  const Td doo = g.pw(CUDNN_POINTWISE_MUL, dout, o, kF32, L.o);  // ops 1-3: D = rowsum(dO o O)
  const Td rowsum = g.virt(kF32, L.rowvec);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, doo, rowsum);
  g.pointwise(CUDNN_POINTWISE_MUL, rowsum, one, softmax_sum);
  const Td s = masked_scores(g, L, q, kt, scale, neg_inf);  // ops 4-11: P from the stats
  const Td shifted = g.pw(CUDNN_POINTWISE_SUB, s, stats, kF32, L.s);
  const Td p = g.pw(CUDNN_POINTWISE_EXP, shifted, nullptr, kF32, L.s);
  const Td pt = g.virt(kBf16, L.st);  // ops 12-13: dV
  g.reshape(p, pt);
  group_matmul(g, k, L, pt, dout, dv);
  Td dp = g.virt(kF32, L.s);  // ops 14-17: dS
  g.matmul(dout, vt, dp);
  if (mul_dp) dp = g.pw(CUDNN_POINTWISE_MUL, dp, one, kF32, L.s);
  const Td ds1 = g.pw(CUDNN_POINTWISE_SUB, dp, softmax_sum, kF32, L.s);
  const Td ds2 = g.pw(CUDNN_POINTWISE_MUL, ds1, p, kF32, L.s);
  const Td ds = g.pw(CUDNN_POINTWISE_MUL, ds2, scale, kF32, L.s);
  const Td dst = g.virt(kBf16, L.st);  // ops 18-19: dK
  g.reshape(ds, dst);
  group_matmul(g, k, L, dst, q, dk);
  const Td kv = g.virt(kF32, L.kv);  // ops 20-22: dQ through the f32 accumulator (K reshaped: f32, §8 q. 2)
  g.reshape(kt, kv);
  g.matmul(ds, kv, dq_accum);
  g.pointwise(CUDNN_POINTWISE_IDENTITY, dq_accum, nullptr, dq);
  return std::move(g).finish(handle);
}

// ---- running ----

// A non-virtual tensor's UID and its data (a host pointer for a by-value scalar).
using Binding = std::pair<int64_t, void*>;

// One run of a plan: the variant pack (every non-virtual UID) and cudnnBackendExecute on the
// handle's stream; the workspace from the pool (it returns there once the run is queued: the
// next user is queued after it).
void execute(cudnnHandle_t handle, const Plan& plan, std::span<const Binding> bindings, MemoryPool& pool) {
  std::vector<int64_t> uids;
  std::vector<void*> pointers;
  for (const auto& [uid, pointer] : bindings) uids.push_back(uid), pointers.push_back(pointer);
  const std::shared_ptr<PoolBlock> workspace =
      plan.workspace > 0 ? pool.acquire(static_cast<size_t>(plan.workspace)) : nullptr;
  void* ws = workspace ? workspace->ptr : nullptr;
  try {
    Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "variant pack");
    pack.set_array(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, uids.size(), uids.data());
    pack.set_array(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, pointers.size(), pointers.data());
    pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, ws);
    pack.finalize();
    check(cudnn().cudnnBackendExecute(handle, plan.plan.get(), pack.get()), "cudnnBackendExecute");
  } catch (const Refusal& r) {
    fail("cuDNN attention: {}", r.why);
  }
}

uint16_t* bits(const Tensor& t) { return reinterpret_cast<uint16_t*>(t.bf16_data()); }

// Where Q, K and V (or dQ, dK and dV) start in a packed row buffer: columns 0, C and C + NKV hs.
struct Parts {
  void *q, *k, *v;
  Parts(const uint16_t* rows, const Key& k_) {
    auto* base = const_cast<uint16_t*>(rows);
    const int64_t C = static_cast<int64_t>(k_.NH) * k_.hs, kv_heads = static_cast<int64_t>(k_.NKV) * k_.hs;
    q = base, k = base + C, v = base + C + kv_heads;
  }
};

// Head sizes cuDNN's bf16 attention takes on every architecture and version 9 (§6), and the
// flash kernels too (a refused backward runs on them); something to do.
bool qualifies(const Key& k) { return k.B > 0 && k.T > 0 && k.hs % 8 == 0 && k.hs <= kMaxFlashHead; }
bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The version and hardware limits of §6 the graphs cannot express, checked as the frontend does.
void check_limits(const Key& k, Pass pass, size_t version, int sm) {
  if (sm < 8) throw Refusal{fmt::format("sm_{}x: cuDNN's fused attention needs sm_80 or newer", sm)};
  if (version == 91000 || version == 91001)
    throw Refusal{"cuDNN 9.10.0 and 9.10.1 have known bugs in fused attention (the frontend refuses them)"};
  if (pass == kForward) return;
  if (k.T < 2) throw Refusal{"cuDNN's attention backward refuses one token"};
  if (version < 91600 && k.T % 128 != 0)
    throw Refusal{
        fmt::format("cuDNN {} needs a padding mask for a backward over T = {} (not a multiple of 128)", version, k.T)};
  if (sm == 9 && version < 92600 && k.T % 128 == 64)
    throw Refusal{
        fmt::format("cuDNN {} can give NaN on sm_90 in a backward over T = 64 mod 128 (fixed in 9.26)", version)};
}

}  // namespace

// ---- CudnnAttention ----

struct CudnnAttention::State {
  bool on = true;
  cudnnHandle_t handle = nullptr;
  size_t version = 0;
  int sm = 0;
  struct Slot {
    bool tried = false;
    std::unique_ptr<Plan> plan;  // null: refused
  };
  std::map<Key, std::array<Slot, 2>> plans;  // [kForward], [kBackward]

  ~State() { drop(); }
  void drop() noexcept {
    plans.clear();
    if (handle != nullptr) (void)cudnn().cudnnDestroy(handle);
    handle = nullptr;
  }
  void start(const Ctx& ctx);
  const Plan* plan(const Ctx& ctx, const Key& k, Pass pass);
  std::unique_ptr<Plan> build(const Key& k, Pass pass) const;
  float neg_inf() const {  // §1: -inf from 9.10, lowest() before
    return version >= 91000 ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::lowest();
  }
};

// Loads cuDNN and makes the handle on the backend's stream, once.
void CudnnAttention::State::start(const Ctx& ctx) {
  if (handle != nullptr) return;
  try {
    (void)cudnn();
  } catch (const Error& e) {
    throw Refusal{e.what()};
  }
  version = cudnn().cudnnGetVersion();
  int device = 0;
  PIPETRAIN_CUDA_CHECK(cudaGetDevice(&device));
  PIPETRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&sm, cudaDevAttrComputeCapabilityMajor, device));
  cudnnHandle_t h = nullptr;
  check(cudnn().cudnnCreate(&h), "cudnnCreate");
  const cudnnStatus_t status = cudnn().cudnnSetStream(h, ctx.stream);
  if (status != CUDNN_STATUS_SUCCESS) {
    const std::string why = describe("cudnnSetStream", status);
    (void)cudnn().cudnnDestroy(h);
    throw Refusal{why};
  }
  handle = h;
}

std::unique_ptr<Plan> CudnnAttention::State::build(const Key& k, Pass pass) const {
  check_limits(k, pass, version, sm);
  return pass == kForward ? forward_plan(handle, k) : backward_plan(handle, k, version < 90500);
}

// The plan of a shape and pass: built at the first call, then kept (a refusal too).
const Plan* CudnnAttention::State::plan(const Ctx& ctx, const Key& k, Pass pass) {
  Slot& slot = plans[k][pass];
  if (slot.tried) return slot.plan.get();
  try {
    start(ctx);
  } catch (const Refusal& r) {
    on = false;
    plans.erase(k);
    fmt::print(stderr, "pipetrain: cuda backend: cuDNN attention is off ({}); the flash kernels run attention\n",
               r.why);
    return nullptr;
  }
  slot.tried = true;
  try {
    slot.plan = build(k, pass);
  } catch (const Refusal& r) {
    fmt::print(stderr,
               "pipetrain: cuda backend: cuDNN refuses the attention {} of B={} T={} NH={} NKV={} hs={} ({}); the "
               "flash kernels run it\n",
               pass == kForward ? "forward" : "backward", k.B, k.T, k.NH, k.NKV, k.hs, r.why);
  }
  return slot.plan.get();
}

CudnnAttention::CudnnAttention() : state_(std::make_unique<State>()) {
  const char* env = std::getenv("PIPETRAIN_CUDNN_ATTENTION");
  state_->on = env == nullptr || std::strcmp(env, "0") != 0;
}

CudnnAttention::~CudnnAttention() = default;

void CudnnAttention::release() noexcept { state_->drop(); }

std::unique_ptr<AttentionStash> CudnnAttention::forward(const Ctx& ctx, float* out, const uint16_t* qkv, int B, int T,
                                                        int C, int NH, int NKV, MemoryPool& pool) {
  const Key k{B, T, NH, NKV, C / NH};
  if (!state_->on || !qualifies(k) || !aligned(qkv)) return nullptr;
  const Plan* plan = state_->plan(ctx, k, kForward);
  if (plan == nullptr) return nullptr;
  auto stash = std::make_unique<CudnnAttentionStash>();
  stash->out = Tensor::empty(pool, {B, T, C}, DType::BF16);
  stash->stats = Tensor::empty(pool, {B, NH, T});
  float scale = 1.0f / std::sqrt(static_cast<float>(k.hs)), neg_inf = state_->neg_inf();  // read at the launch
  const Parts in(qkv, k);
  const std::array<Binding, 7> bindings = {{{kQ, in.q},
                                            {kK, in.k},
                                            {kV, in.v},
                                            {kO, bits(stash->out)},
                                            {kStats, stash->stats.f32()},
                                            {kScale, &scale},
                                            {kNegInf, &neg_inf}}};
  execute(state_->handle, *plan, bindings, pool);
  cast_to_f32(ctx, out, bits(stash->out), static_cast<size_t>(stash->out.numel()));
  return stash;
}

namespace {

// A backward cuDNN refuses, on the flash kernels: qkv and O widened, the stats as their lse.
void flash_backward(const Ctx& ctx, float* dqkv, const float* dout, const uint16_t* qkv,
                    const CudnnAttentionStash& stash, int B, int T, int C, int NH, int NKV, MemoryPool& pool) {
  const int64_t rows = static_cast<int64_t>(B) * T, width = C + 2 * static_cast<int64_t>(NKV) * (C / NH);
  const Tensor wide = Tensor::empty(pool, {rows * width}), out = Tensor::empty(pool, {rows * C});
  const Tensor delta = Tensor::empty(pool, {B, NH, T});
  cast_to_f32(ctx, wide.f32(), qkv, static_cast<size_t>(wide.numel()));
  cast_to_f32(ctx, out.f32(), bits(stash.out), static_cast<size_t>(out.numel()));
  flash_attention_backward(ctx, dqkv, delta.f32(), dout, wide.f32(), out.f32(), stash.stats.f32(), B, T, C, NH, NKV,
                           nullptr);
}

}  // namespace

void CudnnAttention::backward(const Ctx& ctx, float* dqkv, const float* dout, const uint16_t* qkv,
                              const CudnnAttentionStash& stash, int B, int T, int C, int NH, int NKV,
                              MemoryPool& pool) {
  const Key k{B, T, NH, NKV, C / NH};
  const Plan* plan = state_->on && aligned(qkv) ? state_->plan(ctx, k, kBackward) : nullptr;
  if (plan == nullptr) return flash_backward(ctx, dqkv, dout, qkv, stash, B, T, C, NH, NKV, pool);
  const int64_t rows = static_cast<int64_t>(B) * T, width = C + 2 * static_cast<int64_t>(NKV) * k.hs;
  const Tensor d_out = Tensor::empty(pool, {rows * C}, DType::BF16),
               d_qkv = Tensor::empty(pool, {rows * width}, DType::BF16);
  const Tensor softmax_sum = Tensor::empty(pool, {B, NH, T}), dq_accum = Tensor::empty(pool, {B, NH, T, k.hs});
  cast_to_bf16(ctx, bits(d_out), dout, static_cast<size_t>(d_out.numel()));
  PIPETRAIN_CUDA_CHECK(cudaMemsetAsync(dq_accum.f32(), 0, dq_accum.bytes(), ctx.stream));
  float scale = 1.0f / std::sqrt(static_cast<float>(k.hs)), neg_inf = state_->neg_inf(), one = 1.0f;
  const Parts in(qkv, k), grad(bits(d_qkv), k);
  const std::array<Binding, 14> bindings = {{{kQ, in.q},
                                             {kK, in.k},
                                             {kV, in.v},
                                             {kO, bits(stash.out)},
                                             {kStats, stash.stats.f32()},
                                             {kScale, &scale},
                                             {kNegInf, &neg_inf},
                                             {kOne, &one},
                                             {kSoftmaxSum, softmax_sum.f32()},
                                             {kDqAccum, dq_accum.f32()},
                                             {kDO, bits(d_out)},
                                             {kDQ, grad.q},
                                             {kDK, grad.k},
                                             {kDV, grad.v}}};
  execute(state_->handle, *plan, bindings, pool);
  cast_to_f32(ctx, dqkv, bits(d_qkv), static_cast<size_t>(d_qkv.numel()));
}

}  // namespace pipetrain::cuda
