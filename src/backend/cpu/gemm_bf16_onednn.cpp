// bf16 products through oneDNN's matmul (pipetrain/backend/bf16_products.hpp): bf16
// operands read in place through strides (no widening, no copy), f32 accumulation, the
// f32 result written into C's rows, beta as a sum post-op and the bias as matmul's own
// bias. A product's primitive is built (JIT) once per shape and kept: a run repeats a
// handful of shapes every microbatch.
#include "cpu_kernels.hpp"

#ifdef PIPETRAIN_HAVE_ONEDNN
#include <dlfcn.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <atomic>
#include <mutex>
#include <optional>
#include <unordered_map>

#include <fmt/format.h>

#include "onednn_matmul.hpp"

namespace pipetrain::cpu {

namespace {

struct Shape {
  bool ta, tb, bias;
  int M, N, K, lda, ldb, ldc;
  float alpha, beta;
  bool operator==(const Shape&) const = default;
};

struct ShapeHash {
  size_t operator()(const Shape& s) const {
    size_t h = static_cast<size_t>(s.ta) | static_cast<size_t>(s.tb) << 1 | static_cast<size_t>(s.bias) << 2;
    for (int v : {s.M, s.N, s.K, s.lda, s.ldb, s.ldc}) h = h * 1000003u ^ static_cast<size_t>(v);
    return h ^ std::hash<float>{}(s.alpha) * 31u ^ std::hash<float>{}(s.beta);
  }
};

struct Matmul {
  dnnl::matmul prim;
  dnnl::memory::desc a, b, c, bias;
};

class Matmuls {
 public:
  // The primitive for `s`, or nullopt when oneDNN has only its reference implementation
  // for it (slower than widening) or none at all.
  const std::optional<Matmul>& get(const Shape& s) {
    std::lock_guard lock(mu_);
    auto it = cache_.find(s);
    if (it == cache_.end()) it = cache_.emplace(s, make(s)).first;
    return it->second;
  }
  dnnl::engine& engine() { return engine_; }
  dnnl::stream& stream() { return stream_; }

 private:
  std::optional<Matmul> make(const Shape& s) {
    using dt = dnnl::memory::data_type;
    using dims = dnnl::memory::dims;
    // Row-major storage through strides: op(A) is M x K, op(B) is K x N.
    const dnnl::memory::desc a({s.M, s.K}, dt::bf16, s.ta ? dims{1, s.lda} : dims{s.lda, 1});
    const dnnl::memory::desc b({s.K, s.N}, dt::bf16, s.tb ? dims{1, s.ldb} : dims{s.ldb, 1});
    const dnnl::memory::desc c({s.M, s.N}, dt::f32, dims{s.ldc, 1});
    dnnl::primitive_attr attr;
    if (s.alpha != 1.0f) attr.set_output_scales(0, {s.alpha});
    if (s.beta != 0.0f) {
      dnnl::post_ops ops;
      ops.append_sum(s.beta);  // C = alpha op(A) op(B) + beta C
      attr.set_post_ops(ops);
    }
    const dnnl::memory::desc bias = s.bias ? dnnl::memory::desc({1, s.N}, dt::f32, dims{s.N, 1}) : dnnl::memory::desc();
    const auto pd = optimized_matmul(s.bias ? dnnl::matmul::desc(a, b, bias, c) : dnnl::matmul::desc(a, b, c), attr,
                                     engine_, fmt::format("the bf16 product {}x{}x{}", s.M, s.N, s.K));
    if (!pd) return std::nullopt;  // the caller widens for sgemm
    return Matmul{dnnl::matmul(*pd), a, b, c, bias};
  }

  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream_{engine_};
  std::unordered_map<Shape, std::optional<Matmul>, ShapeHash> cache_;
  std::mutex mu_;
};

Matmuls& matmuls() {
  static Matmuls m;
  return m;
}

std::atomic<long> products_run{0};

}  // namespace

bool gemm_bf16_onednn(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const bf16* A, int lda,
                      const bf16* B, int ldb, float beta, float* C, int ldc, const float* bias) {
  if (M <= 0 || N <= 0 || K <= 0 || (bias && alpha != 1.0f)) return false;
  Matmuls& m = matmuls();
  const auto& mm = m.get({trans_a, trans_b, bias != nullptr, M, N, K, lda, ldb, ldc, alpha, beta});
  if (!mm) return false;
  auto mem = [&](const dnnl::memory::desc& d, const void* p) { return dnnl::memory(d, m.engine(), const_cast<void*>(p)); };
  std::unordered_map<int, dnnl::memory> args = {
      {DNNL_ARG_SRC, mem(mm->a, A)}, {DNNL_ARG_WEIGHTS, mem(mm->b, B)}, {DNNL_ARG_DST, mem(mm->c, C)}};
  if (bias) args.emplace(DNNL_ARG_BIAS, mem(mm->bias, bias));
  mm->prim.execute(m.stream(), args);
  m.stream().wait();
  products_run.fetch_add(1, std::memory_order_relaxed);
  return true;
}

bool onednn_built_in() { return true; }
long onednn_products_run() { return products_run.load(std::memory_order_relaxed); }

bool onednn_runs_bf16() {
  static const bool usable = [] {
    // A small product of each layout a dense layer uses, as a layer would ask for it.
    for (auto [ta, tb] : {std::pair{false, true}, {false, false}, {true, false}})
      if (!matmuls().get({ta, tb, false, 64, 64, 64, 64, 64, 64, 1.0f, 0.0f})) return false;
    return true;
  }();
  return usable;
}

bool onednn_native_bf16() {
  const auto isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
  return (isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16;
}

std::string onednn_description() {
  const dnnl_version_t* v = dnnl_version();
  const char* isa = "";
  switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_avx512_core_amx: isa = "avx512_core_amx"; break;
    case dnnl_cpu_isa_avx512_core_bf16: isa = "avx512_core_bf16"; break;
    case dnnl_cpu_isa_avx512_core_vnni: isa = "avx512_core_vnni"; break;
    case dnnl_cpu_isa_avx512_core: isa = "avx512_core"; break;
    case dnnl_cpu_isa_avx2_vnni: isa = "avx2_vnni"; break;
    case dnnl_cpu_isa_avx2: isa = "avx2"; break;
    default: isa = "older ISA"; break;
  }
  return fmt::format("oneDNN {}.{}.{} ({})", v->major, v->minor, v->patch, isa);
}

void onednn_set_threads(int n) {
  // oneDNN's CPU runtime here is OpenMP (Debian's build): its thread count is the
  // runtime's. Looked up at run time, so that a oneDNN built on TBB or a threadpool
  // needs nothing of OpenMP.
  using SetThreads = void (*)(int);
  if (auto set = reinterpret_cast<SetThreads>(::dlsym(RTLD_DEFAULT, "omp_set_num_threads"))) set(n < 1 ? 1 : n);
}

}  // namespace pipetrain::cpu

#else  // built without oneDNN: every product widens (gemm_bf16.cpp)

namespace pipetrain::cpu {
bool gemm_bf16_onednn(bool, bool, int, int, int, float, const bf16*, int, const bf16*, int, float, float*, int,
                      const float*) {
  return false;
}
bool onednn_built_in() { return false; }
long onednn_products_run() { return 0; }
bool onednn_runs_bf16() { return false; }
bool onednn_native_bf16() { return false; }
std::string onednn_description() { return "oneDNN (not built in)"; }
void onednn_set_threads(int) {}
}  // namespace pipetrain::cpu

#endif
