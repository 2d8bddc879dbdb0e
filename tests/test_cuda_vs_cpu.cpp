// The CUDA backend against the CPU backend on shapes the kernel harness does not
// reach but the GPU code paths depend on: attention batched over sequences
// (B > NH) and with the larger query blocks of long sequences, GPT-2-sized rows
// (C = 768, V = 50257), a skewed token batch for the deterministic embedding
// scatter (bit-identical to the CPU, and run to run), and the explicit
// to_device/to_host transfers, and the mixture-of-experts row kernels and router; head sizes past
// the flash kernels', empty batches and decoding over a long cache. Skips with
// "no GPU: <reason>" without a usable GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernel_reference.hpp"
#include "moe_reference.hpp"
#include "pipetrain/backend/backend.hpp"
#include "pipetrain/backend/cuda.hpp"
#include "pipetrain/backend/moe_routing.hpp"

namespace pipetrain {
namespace {

using ref::max_abs;
using ref::random_vec;
using ref::Vec;
using Tokens = std::vector<int32_t>;

// A device buffer filled with to_device and read with to_host.
template <class T>
class Buf {
 public:
  Buf(Backend& be, const std::vector<T>& host) : be_(be), n_(host.size()) {
    p_ = static_cast<T*>(be_.allocate(n_ * sizeof(T)));
    be_.to_device(p_, host.data(), n_ * sizeof(T));
  }
  ~Buf() { be_.deallocate(p_, n_ * sizeof(T)); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  T* get() { return p_; }
  std::vector<T> host() const {
    std::vector<T> h(n_);
    be_.to_host(h.data(), p_, n_ * sizeof(T));
    return h;
  }

 private:
  Backend& be_;
  size_t n_;
  T* p_ = nullptr;
};

// |a - b| <= tol * max|b| everywhere.
::testing::AssertionResult near(const Vec& a, const Vec& b, double tol) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "size mismatch";
  const double scale = max_abs(b);
  for (size_t i = 0; i < a.size(); ++i) {
    if (!(std::abs(double(a[i]) - b[i]) <= tol * scale)) {
      return ::testing::AssertionFailure() << "at " << i << ": cuda " << a[i] << " cpu " << b[i]
                                           << " (max |cpu| " << scale << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

class CudaVsCpu : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda_available(&why)) GTEST_SKIP() << "no GPU: " << why;
    gpu_ = make_cuda_backend();
    cpu_ = make_cpu_backend();
  }
  std::unique_ptr<Backend> gpu_, cpu_;
};

// Runs attention forward and backward on `be`; returns out and dqkv.
struct AttnResult {
  Vec out, dqkv;
};
AttnResult attention(Backend& be, const Vec& qkv, const Vec& dout, int B, int T, int C, int NH) {
  auto pool = MemoryPool::create(be);
  Buf<float> q(be, qkv), d(be, dout), out(be, Vec(size_t(B) * T * C, 5.0f)), dq(be, Vec(qkv.size(), NAN));
  auto stash = be.attention_forward(out.get(), q.get(), B, T, C, NH, NH, *pool, DType::F32);
  be.attention_backward(dq.get(), d.get(), q.get(), *stash, B, T, C, NH, NH, *pool);
  return {out.host(), dq.host()};
}

struct AttnShape {
  int B, T, C, NH;
};
// The GPU's attention forward and backward against the CPU's on random values.
void expect_attention_matches(Backend& gpu, Backend& cpu, AttnShape s) {
  SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C << " NH=" << s.NH);
  const Vec qkv = random_vec(size_t(s.B) * s.T * 3 * s.C, 200, -2.0f, 2.0f);
  const Vec dout = random_vec(size_t(s.B) * s.T * s.C, 201);
  const AttnResult g = attention(gpu, qkv, dout, s.B, s.T, s.C, s.NH);
  const AttnResult c = attention(cpu, qkv, dout, s.B, s.T, s.C, s.NH);
  EXPECT_TRUE(near(g.out, c.out, 1e-5));
  EXPECT_TRUE(near(g.dqkv, c.dqkv, 1e-4));
}

TEST_F(CudaVsCpu, AttentionShapes) {
  // B > NH (cuBLAS batches over sequences), T = 300 (five 64-row blocks), T = 1030
  // (192-row query blocks and a short last one).
  for (AttnShape s : {AttnShape{5, 70, 16, 2}, AttnShape{2, 300, 64, 4}, AttnShape{1, 1030, 32, 2}})
    expect_attention_matches(*gpu_, *cpu_, s);
}

// Head sizes past the flash kernels' 128 (the probability path: 256) and at it (128), and
// empty batches (B = 0 or T = 0: nothing to do, where a zero-sized grid would fail to launch).
TEST_F(CudaVsCpu, AttentionHeadSizesAndEmptyBatches) {
  for (AttnShape s : {AttnShape{2, 70, 512, 2}, AttnShape{1, 130, 256, 2}}) expect_attention_matches(*gpu_, *cpu_, s);
  for (const auto& [B, T] : {std::pair{0, 16}, std::pair{2, 0}}) {
    SCOPED_TRACE(::testing::Message() << "B=" << B << " T=" << T);
    auto pool = MemoryPool::create(*gpu_);
    Buf<float> q(*gpu_, Vec(48, 1.0f)), d(*gpu_, Vec(16, 1.0f)), out(*gpu_, Vec(16, 5.0f)), dq(*gpu_, Vec(48, 7.0f));
    auto stash = gpu_->attention_forward(out.get(), q.get(), B, T, 16, 2, 2, *pool, DType::F32);
    gpu_->attention_backward(dq.get(), d.get(), q.get(), *stash, B, T, 16, 2, 2, *pool);
    EXPECT_EQ(out.host(), Vec(16, 5.0f));
    EXPECT_EQ(dq.host(), Vec(48, 7.0f));
  }
}

// Decoding against a long cache: 16 000 keys' scores (62.5 KiB) need more than the 48 KiB
// of shared memory a block gets without opting in.
TEST_F(CudaVsCpu, DecodeAttentionOverALongCache) {
  const int NH = 4, NKV = 2, hs = 16, pos = 16000, n = 2, L = pos + n;
  const Vec q = random_vec(size_t(n) * NH * hs, 220), k = random_vec(size_t(L) * NKV * hs, 221);
  const Vec v = random_vec(size_t(L) * NKV * hs, 222);
  Vec got, want;
  for (Backend* be : {gpu_.get(), cpu_.get()}) {
    Buf<float> bq(*be, q), bk(*be, k), bv(*be, v), out(*be, Vec(size_t(n) * NH * hs, NAN));
    be->attention_decode(out.get(), bq.get(), NH * hs, bk.get(), bv.get(), NKV * hs, n, pos, NH, NKV, hs);
    (be == gpu_.get() ? got : want) = out.host();
  }
  // Sums of L terms in another order: ~sqrt(L) u = 7.5e-6 each (random-walk rounding), a few in a row.
  EXPECT_TRUE(near(got, want, 1e-4));
}

// Token checks deferred to one per step: the calls do not wait; check_deferred reports the
// first recorded check that failed, with the CPU's message and the offending value, once.
TEST_F(CudaVsCpu, DeferredTokenChecksReportTheFirstBadId) {
  const int B = 2, T = 4, C = 8;
  Buf<float> wte(*gpu_, random_vec(size_t(16) * C, 230)), wpe(*gpu_, random_vec(size_t(T) * C, 231));
  Buf<float> out(*gpu_, Vec(size_t(B) * T * C));
  Buf<int32_t> good(*gpu_, {1, 2, 3, 4, 5, 6, 7, 8}), bad(*gpu_, {1, 2, 3, 4, 5, -7, 7, -9}),
      worse(*gpu_, {1, -3, 3, 4, 5, 6, 7, 8});
  gpu_->defer_checks(true);
  for (Buf<int32_t>* tokens : {&good, &bad, &worse})
    gpu_->embedding_forward(out.get(), tokens->get(), wte.get(), wpe.get(), B, T, C);
  try {
    gpu_->check_deferred();
    ADD_FAILURE() << "no error for the negative tokens";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "embedding: token -7 at position 5 is negative");
  }
  gpu_->check_deferred();  // reported once, then clear
  gpu_->defer_checks(false);
  EXPECT_THROW(gpu_->embedding_forward(out.get(), worse.get(), wte.get(), wpe.get(), B, T, C), Error);
}

TEST_F(CudaVsCpu, Gpt2SizedRows) {
  const int N = 64, C = 768;
  const Vec x = random_vec(size_t(N) * C, 210, -3.0f, 5.0f), w = random_vec(C, 211),
            b = random_vec(C, 212), dout = random_vec(x.size(), 213);
  std::vector<Vec> got[2];
  for (int k = 0; k < 2; ++k) {
    Backend& be = k == 0 ? *gpu_ : *cpu_;
    Buf<float> dx(be, x), dw(be, w), db(be, b), out(be, Vec(x.size())), m(be, Vec(N)),
        r(be, Vec(N)), dd(be, dout), gx(be, Vec(x.size(), 0.5f)), gw(be, Vec(C, 0.0f)),
        gb(be, Vec(C, 0.0f));
    be.layernorm_forward(out.get(), m.get(), r.get(), dx.get(), dw.get(), db.get(), N, C, 1e-5f);
    be.layernorm_backward_input(gx.get(), dd.get(), dx.get(), dw.get(), m.get(), r.get(), N, C);
    be.layernorm_backward_weight(gw.get(), gb.get(), dd.get(), dx.get(), m.get(), r.get(), N, C);
    got[k] = {out.host(), m.host(), r.host(), gx.host(), gw.host(), gb.host()};
  }
  for (size_t i = 0; i < got[0].size(); ++i) EXPECT_TRUE(near(got[0][i], got[1][i], 1e-5)) << i;

  const int R = 8, V = 50257, Vp = 50304;
  Vec logits = random_vec(size_t(R) * Vp, 214, -6.0f, 6.0f);
  Tokens t(R);
  for (int n = 0; n < R; ++n) t[n] = (n * 7919 + 11) % V;
  t[0] = V - 1;
  Vec loss[2], grad[2];
  for (int k = 0; k < 2; ++k) {
    Backend& be = k == 0 ? *gpu_ : *cpu_;
    Buf<float> l(be, logits), lo(be, Vec(R));
    Buf<int32_t> dt(be, t);
    be.crossentropy_forward(lo.get(), l.get(), dt.get(), R, V, Vp, 0.5f);
    loss[k] = lo.host();
    grad[k] = l.host();
  }
  EXPECT_TRUE(near(loss[0], loss[1], 1e-5));
  EXPECT_TRUE(near(grad[0], grad[1], 1e-5));
}

TEST_F(CudaVsCpu, EmbeddingBackwardIsExactAndDeterministic) {
  const int B = 8, T = 512, C = 100, vocab = 1000, N = B * T;
  Tokens tok(N);
  for (int n = 0; n < N; ++n) tok[n] = n % 2 == 0 ? 7 : (n * 31 + 3) % vocab;  // half are 7
  const Vec dout = random_vec(size_t(N) * C, 220), gte0 = random_vec(size_t(vocab) * C, 221),
            gpe0 = random_vec(size_t(T) * C, 222);
  Vec gte[3], gpe[3];
  for (int k = 0; k < 3; ++k) {  // gpu, gpu again, cpu
    Backend& be = k < 2 ? *gpu_ : *cpu_;
    Buf<float> dd(be, dout), g(be, gte0), p(be, gpe0);
    Buf<int32_t> dt(be, tok);
    be.embedding_backward(g.get(), p.get(), dd.get(), dt.get(), B, T, C);
    gte[k] = g.host();
    gpe[k] = p.host();
  }
  EXPECT_EQ(gte[0], gte[1]);  // run to run
  EXPECT_EQ(gte[0], gte[2]);  // same order of additions as the CPU
  EXPECT_EQ(gpe[0], gpe[2]);
}

TEST_F(CudaVsCpu, ReductionsAreDeterministic) {
  const Vec x = random_vec(size_t(3) << 20, 230);
  Buf<float> d(*gpu_, x);
  const double a = gpu_->sum_squares(d.get(), x.size());
  EXPECT_EQ(a, gpu_->sum_squares(d.get(), x.size()));
  Buf<float> c(*cpu_, x);
  EXPECT_NEAR(a, cpu_->sum_squares(c.get(), x.size()), 1e-12 * a);
}

// The mixture-of-experts row kernels (backend/cuda/moe_rows.cu, as model/moe_mlp.cpp calls
// them: 300 tokens, top 2, GPT-2's width) against the CPU's. The gather is one product per
// element (exact); the combine adds k weighted rows in choice order (within 4 eps of the
// largest partial sum: k products and k sums, each rounded once); a dot sums C products in
// whatever order the GPU takes (C eps of the sum of |terms| bounds it; 1e-4 relative to the
// largest dot covers C = 768).
TEST_F(CudaVsCpu, MixtureOfExpertsRows) {
  const int N = 300, k = 2, C = 768, R = N * k;
  const Vec x = random_vec(size_t(N) * C, 240), rows_in = random_vec(size_t(R) * C, 241), w = random_vec(R, 242);
  std::vector<int32_t> source(R), row(R);
  for (int i = 0; i < R; ++i) source[size_t(i)] = (i * 7919) % N;  // each routed row reads a token
  for (int i = 0; i < R; ++i) row[size_t(i)] = (i * 104729) % R;   // a permutation (104729 is prime to 600)
  struct Out {
    Vec gathered, combined, dots;
  };
  const auto run = [&](Backend& be) {
    Buf<float> bx(be, x), bin(be, rows_in), bw(be, w), g(be, Vec(rows_in.size(), NAN)), y(be, x), d(be, Vec(R, NAN));
    Buf<int32_t> bs(be, source), br(be, row);
    be.gather_rows(g.get(), bx.get(), bs.get(), bw.get(), R, C);
    be.combine_rows(y.get(), bin.get(), br.get(), bw.get(), N, k, C);
    be.row_dots(d.get(), bx.get(), bin.get(), br.get(), N, k, C);
    return Out{g.host(), y.host(), d.host()};
  };
  const Out gpu = run(*gpu_), cpu = run(*cpu_);
  EXPECT_EQ(gpu.gathered, cpu.gathered);
  EXPECT_TRUE(near(gpu.combined, cpu.combined, 4 * 6e-8));
  EXPECT_TRUE(near(gpu.dots, cpu.dots, 1e-4));
}

// One routing and its backward on `be`, everything read back to the host.
struct RoutedOnce {
  RouteCounts counts;
  Vec scores, weight, row_weight, dlogits;
  std::vector<int32_t> expert, row, source, chosen;
};
RoutedOnce route_once(Backend& be, const Vec& logits, const Vec& bias, const Vec& dweight, int N,
                      const RouterSpec& spec) {
  const size_t E = size_t(spec.experts), pairs = size_t(N) * spec.top_k;
  auto pool = MemoryPool::create(be);
  Buf<float> l(be, logits), b(be, bias.empty() ? Vec(E) : bias), dw(be, dweight), scores(be, Vec(N * E, NAN)),
      weight(be, Vec(pairs, NAN)), row_weight(be, Vec(pairs, NAN)), dl(be, Vec(N * E, NAN));
  Buf<int32_t> expert(be, std::vector<int32_t>(pairs, -7)), row(be, std::vector<int32_t>(pairs, -7)),
      source(be, std::vector<int32_t>(pairs, -7)), chosen(be, std::vector<int32_t>(E + 1, -7));
  const RoutedArrays out{scores.get(), expert.get(),     weight.get(), row.get(),
                         source.get(), row_weight.get(), chosen.get()};
  RoutedOnce r;
  r.counts = be.moe_route(out, l.get(), bias.empty() ? nullptr : b.get(), N, spec, *pool);
  be.moe_router_backward(dl.get(), out, l.get(), dw.get(), N, spec, 0.7);
  r.scores = scores.host(), r.weight = weight.host(), r.dlogits = dl.host();
  r.expert = expert.host(), r.row = row.host(), r.chosen = chosen.host();
  const auto rows = size_t(r.counts.rows());
  r.source = source.host(), r.row_weight = row_weight.host();
  r.source.resize(rows), r.row_weight.resize(rows);
  return r;
}

// One case of the router's comparison: its shape, spec, whether a selection bias joins and
// whether the combine weights' gradient is zero (the backward then is the auxiliary losses'
// alone, so the tolerance below measures those).
struct RouterCase {
  int N, E;
  RouterSpec spec;
  bool with_bias = false, aux_only = false, with_nan = false;
};

// Each token's logits 1/8 apart (no two of its scores within rounding of each other, so
// the choices cannot differ between the backends), every 7th token's all equal (ties: to
// the lower expert, or to the larger bias), and with_nan every 5th token's first logit NaN
// (NaN scores rank last).
Vec router_logits(const RouterCase& c) {
  Vec logits(size_t(c.N) * c.E);
  for (int t = 0; t < c.N; ++t)
    for (int e = 0; e < c.E; ++e)
      logits[size_t(t) * c.E + e] = t % 7 == 0 ? 0.5f : float((t * 5 + e * 11) % 64) / 8 - 4;
  if (c.with_nan)
    for (int t = 3; t < c.N; t += 5) logits[size_t(t) * c.E] = NAN;
  return logits;
}

// The router on the GPU (backend/cuda/moe_routing.cu) against the CPU's (both compile the
// rule of backend/moe_router_rule.hpp, neither contracting multiply-adds), on the logits of
// router_logits: softmax and sigmoid, renormalised or not, k = 1 to 4, 16 and 40 experts,
// a selection bias, a capacity, forced balance, 3 tokens (fewer choices than the ranking's
// warps) and NaN logits. The choices, rows, sources and counts exactly. Scores and weights
// are each one rounding of a double whose exp may differ by an ulp of double between host
// and device: one float eps of the largest. The losses are double sums in another order:
// 1e-12 relative. The backward rounds once per element from double terms over scores within
// an ulp: 1e-6 of the largest covers E = 40 of them; the aux-only cases hold the auxiliary
// losses' gradient to that bound. The GPU's results twice, bit for bit.
// Since both compile one rule, the GPU's routing is also held to the routing written from
// its definition (moe_reference.hpp), where the choices go by score: the same choices, kept
// rows and loads; weights and losses within 1e-6 of the double reference (scores rounded
// once to float, then sums of at most E = 40 terms).
TEST_F(CudaVsCpu, MixtureOfExpertsRouter) {
  const RouterCase cases[] = {
      {300, 16, {16, 2, RouterKind::Softmax, true, 0.01, 0.001, 0, false}},
      {300, 16, {16, 4, RouterKind::Sigmoid, false, 0.01, 0.001, 0, false}, true},
      {300, 16, {16, 2, RouterKind::Softmax, true, 0.01, 0, 1.0, false}},
      {300, 16, {16, 3, RouterKind::Sigmoid, true, 0, 0.001, 0, true}},
      {300, 40, {40, 1, RouterKind::Softmax, false, 1.0, 0.1, 0, false}, false, true},
      {300, 40, {40, 4, RouterKind::Sigmoid, true, 1.0, 0.1, 0, false}, true, true},
      {3, 16, {16, 2, RouterKind::Softmax, true, 0.01, 0.001, 0, false}},
      {300, 16, {16, 2, RouterKind::Sigmoid, true, 0.01, 0.001, 0, false}, false, false, true},
  };
  for (const RouterCase& c : cases) {
    const RouterSpec& spec = c.spec;
    SCOPED_TRACE(::testing::Message() << c.N << " tokens, top " << spec.top_k << " of " << c.E
                                      << (spec.kind == RouterKind::Sigmoid ? " sigmoid" : " softmax")
                                      << (c.with_bias ? ", bias" : "") << ", capacity " << spec.capacity_factor
                                      << (spec.force_balance ? ", forced" : "") << (c.aux_only ? ", aux only" : "")
                                      << (c.with_nan ? ", NaN" : ""));
    const Vec logits = router_logits(c);
    Vec bias;
    for (int e = 0; c.with_bias && e < c.E; ++e)
      bias.push_back(1e-5f * float(e));  // below any two scores' gap: it breaks ties only
    const Vec dweight = c.aux_only ? Vec(size_t(c.N) * spec.top_k, 0.0f) : random_vec(size_t(c.N) * spec.top_k, 250);
    const RoutedOnce gpu = route_once(*gpu_, logits, bias, dweight, c.N, spec),
                     cpu = route_once(*cpu_, logits, bias, dweight, c.N, spec);
    EXPECT_EQ(gpu.expert, cpu.expert);
    EXPECT_EQ(gpu.row, cpu.row);
    EXPECT_EQ(gpu.source, cpu.source);
    EXPECT_EQ(gpu.chosen, cpu.chosen);
    EXPECT_EQ(gpu.counts.offset, cpu.counts.offset);
    EXPECT_EQ(gpu.counts.chosen, cpu.counts.chosen);
    EXPECT_EQ(gpu.counts.dropped, cpu.counts.dropped);
    const RoutedOnce again = route_once(*gpu_, logits, bias, dweight, c.N, spec);
    EXPECT_EQ(again.row, gpu.row);
    if (c.with_nan) continue;  // NaN scores and losses: only the choices compare
    if (!spec.force_balance) {
      const testing::ReferenceRouting want = testing::reference_routing(logits, bias, c.N, spec);
      for (size_t tj = 0; tj < want.expert.size(); ++tj) {
        ASSERT_EQ(gpu.expert[tj], want.expert[tj]) << "choice " << tj << " against the reference";
        EXPECT_EQ(gpu.row[tj] >= 0, bool(want.kept[tj])) << "choice " << tj << " against the reference";
        EXPECT_NEAR(gpu.weight[tj], want.weight[tj], 1e-6) << "choice " << tj << " against the reference";
      }
      EXPECT_NEAR(gpu.counts.load_balance, want.load_balance, 1e-6 * want.load_balance) << "against the reference";
      EXPECT_NEAR(gpu.counts.z, want.z, 1e-6 * want.z) << "against the reference";
    }
    EXPECT_NEAR(gpu.counts.load_balance, cpu.counts.load_balance, 1e-12 * cpu.counts.load_balance);
    EXPECT_NEAR(gpu.counts.z, cpu.counts.z, 1e-12 * cpu.counts.z);
    EXPECT_TRUE(near(gpu.scores, cpu.scores, 6e-8));
    EXPECT_TRUE(near(gpu.weight, cpu.weight, 6e-8));
    EXPECT_TRUE(near(gpu.row_weight, cpu.row_weight, 6e-8));
    EXPECT_TRUE(near(gpu.dlogits, cpu.dlogits, 1e-6));
    EXPECT_EQ(again.dlogits, gpu.dlogits);
    EXPECT_EQ(again.counts.load_balance, gpu.counts.load_balance);
  }
}

}  // namespace
}  // namespace pipetrain
