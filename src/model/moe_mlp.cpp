// The mixture-of-experts MLP half (pipetrain/model/moe_mlp.hpp): forward, the two
// backward halves. Routing runs on the host (moe_routing.hpp); its index arrays go to the
// device once per microbatch. Products are one sgemm per expert over its rows.
#include "pipetrain/model/moe_mlp.hpp"

#include <cmath>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/comm/communicator.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/model/linear.hpp"
#include "pipetrain/model/moe_exchange.hpp"
#include "pipetrain/model/moe_stats.hpp"
#include "pipetrain/model/precision.hpp"

namespace pipetrain {

using layer_util::tensor_parallel;
using layer_util::tp_allreduce;

namespace {

struct MoeStash : Stash {
  Tensor x, rstd, n;  // input, RMSNorm's, its output
  Routing routing;    // on the host, with the router's logits (N, E) it came from
  std::vector<float> host_logits;
  std::unique_ptr<ExpertExchange> exchange;        // this rank's experts' rows (ep > 1: from every ep rank)
  Tensor rows, source, row_weight;                 // routing's arrays on the device
  Tensor xp, g, u, a;                              // this rank's experts' rows: inputs, gate, up, SwiGLU
  Tensor o;                                        // the routed rows' expert outputs, back in sorted order
  Tensor sg, su, sa;                               // the shared experts' gate, up, SwiGLU (N, S F)
  Tensor dy, dn, dlogits, dout, dg, du, dsg, dsu;  // backward_input, kept for backward_weight (dout, dg,
                                                   // du: this rank's experts' rows)
};

std::string key(int layer, const char* leaf) { return "h." + std::to_string(layer) + "." + leaf; }

Tensor f32(const MicrobatchContext& ctx, int64_t rows, int64_t cols) { return Tensor::empty(*ctx.pool, {rows, cols}); }

template <class T>
Tensor upload(const MicrobatchContext& ctx, const std::vector<T>& host, DType type) {
  Tensor t = Tensor::empty(*ctx.pool, {static_cast<int64_t>(host.size())}, type);
  if (!host.empty()) ctx.backend->to_device(t.raw(), host.data(), host.size() * sizeof(T));
  return t;
}

const float* weight_of(const Parameter& p) { return p.value.f32(); }

// Local expert l's part of this rank's expert rows, for each with rows: how many, and the
// offsets of its first row at widths C and F and of its matrices (F x C elements each).
struct ExpertRows {
  int rows;
  size_t rc, rf, w;
};
template <class Fn>
void each_expert(const ExpertSpans& spans, int C, int F, Fn fn) {
  for (size_t l = 0; l < spans.count.size(); ++l) {
    const auto at = static_cast<size_t>(spans.offset[l]);
    if (spans.count[l] > 0) fn(ExpertRows{spans.count[l], at * C, at * F, l * F * C});
  }
}

// Gate and up (E F, C): this rank's experts' rows (ep: its E / ep experts; tp: its F / tp
// rows of each).
Shard expert_rows(int E, int64_t F, ExpertParallel ep, TensorParallel tp) {
  const int per = E / ep.size;
  const int64_t Fl = F / tp.size;
  if (tp.size == 1) return ep.size == 1 ? Shard{} : Shard{0, {{ep.rank * per * F, per * F}}};
  Shard s{0, {}};
  for (int e = ep.rank * per; e < (ep.rank + 1) * per; ++e) s.blocks.push_back({e * F + tp.rank * Fl, Fl});
  return s;
}

// Down (E C, F): this rank's experts' rows (ep), its F / tp columns of each (tp).
Shard expert_columns(int E, int64_t C, int64_t F, ExpertParallel ep, TensorParallel tp) {
  const int64_t per = E / ep.size * C, Fl = F / tp.size;
  const Shard::Block mine{ep.rank * per, per};
  if (tp.size == 1) return ep.size == 1 ? Shard{} : Shard{0, {mine}};
  Shard s{1, {{tp.rank * Fl, Fl}}};
  if (ep.size > 1) s.rows = {mine};
  return s;
}

// A shared-expert matrix's tp slice along `dim` of its `width` (rows of gate and up,
// columns of down).
Shard shared_slice(int dim, int64_t width, TensorParallel tp) {
  if (tp.size == 1) return {};
  const int64_t n = width / tp.size;
  return {dim, {{tp.rank * n, n}}};
}

Parameter& declare_experts(ParameterStore& p, const std::string& name, std::vector<int64_t> shape, Shard shard,
                           ExpertParallel ep, double std) {
  Parameter& w = p.declare_shard(name, std::move(shape), std::move(shard), Init::Normal, std);
  w.expert_parallel = ep.size > 1;
  return w;
}

// SwiGLU of width F over `rows` rows of x (rows, C) by W_gate, W_up (F, C) at the given
// pointers: g, u and a = silu(g) u.
void swiglu_rows(Backend& be, int rows, int F, int C, const float* x, const float* wg, const float* wu, float* g,
                 float* u, float* a) {
  if (rows == 0) return;
  be.gemm(false, true, rows, F, C, 1.0f, x, C, wg, C, 0.0f, g, F);
  be.gemm(false, true, rows, F, C, 1.0f, x, C, wu, C, 0.0f, u, F);
  be.swiglu_forward(a, g, u, static_cast<size_t>(rows) * F);
}

// The SwiGLU's input gradient: from dh (rows, F), dg and du, and dx (rows, C) += dg Wg + du Wu.
void swiglu_rows_backward(Backend& be, int rows, int F, int C, const float* g, const float* u, const float* wg,
                          const float* wu, float* dh_dg, float* du, float beta, float* dx) {
  if (rows == 0) return;
  be.swiglu_backward(dh_dg, du, dh_dg, g, u, static_cast<size_t>(rows) * F);
  be.gemm(false, false, rows, C, F, 1.0f, dh_dg, F, wg, C, beta, dx, C);
  be.gemm(false, false, rows, C, F, 1.0f, du, F, wu, C, 1.0f, dx, C);
}

}  // namespace

MoeMlp::MoeMlp(const ModelConfig& cfg, int index, ParameterStore& p, ExpertParallel ep, TensorParallel tp)
    : index_(index),
      C_(cfg.d_model),
      F_(cfg.expert_ffn() / tp.size),
      E_(cfg.n_experts),
      SF_(cfg.n_shared_experts * cfg.expert_ffn() / tp.size),
      ep_(ep.size),
      tp_(tp.size),
      eps_(static_cast<float>(cfg.norm_eps)),
      spec_{cfg.n_experts,
            cfg.top_k,
            cfg.router == "sigmoid" ? RouterKind::Sigmoid : RouterKind::Softmax,
            cfg.router_renormalize,
            cfg.aux_loss_coeff,
            cfg.z_loss_coeff,
            cfg.capacity_factor},
      normw_(p.declare(key(index, "mlp_norm.w"), {C_}, Init::Ones)),
      routerw_(p.declare(key(index, "moe.router.w"), {E_, C_}, Init::Normal, 0.02)),
      gatew_(declare_experts(p, key(index, "moe.gate.w"), {E_ * int64_t{cfg.expert_ffn()}, C_},
                             expert_rows(E_, cfg.expert_ffn(), ep, tp), ep, 0.02)),
      upw_(declare_experts(p, key(index, "moe.up.w"), {E_ * int64_t{cfg.expert_ffn()}, C_},
                           expert_rows(E_, cfg.expert_ffn(), ep, tp), ep, 0.02)),
      downw_(declare_experts(p, key(index, "moe.down.w"), {int64_t{E_} * C_, cfg.expert_ffn()},
                             expert_columns(E_, C_, cfg.expert_ffn(), ep, tp), ep,
                             0.02 / std::sqrt(2.0 * cfg.n_layer))) {
  if (ep.size < 1 || E_ % ep.size)
    fail("parallel.ep ({}) must divide model.n_experts ({}): each rank holds whole experts", ep.size, E_);
  if (cfg.expert_ffn() % tp.size)
    fail("parallel.tp ({}) must divide the experts' width (model.expert_ffn_hidden: {})", tp.size, cfg.expert_ffn());
  if (cfg.router_bias_rate > 0) {
    bias_ = &p.declare(selection_bias_name(index), {E_}, Init::Zeros);
    bias_->trained = bias_->updated = false;
  }
  if (SF_ > 0) {
    const int64_t SF = int64_t{SF_} * tp.size;
    sgatew_ = &p.declare_shard(key(index, "moe.shared_gate.w"), {SF, C_}, shared_slice(0, SF, tp), Init::Normal, 0.02);
    supw_ = &p.declare_shard(key(index, "moe.shared_up.w"), {SF, C_}, shared_slice(0, SF, tp), Init::Normal, 0.02);
    sdownw_ = &p.declare_shard(key(index, "moe.shared_down.w"), {C_, SF}, shared_slice(1, SF, tp), Init::Normal,
                               0.02 / std::sqrt(2.0 * cfg.n_layer));
  }
}

std::vector<Parameter*> MoeMlp::parameters() {
  std::vector<Parameter*> ps{&normw_, &routerw_, &gatew_, &upw_, &downw_};
  if (SF_ > 0) ps.insert(ps.end(), {sgatew_, supw_, sdownw_});
  return ps;
}

Tensor MoeMlp::forward(const MicrobatchContext& ctx, const Tensor& x, std::unique_ptr<Stash>& out) {
  return forward_steps(ctx, x, out).run();
}

Tensor MoeMlp::backward_input(const MicrobatchContext& ctx, const Tensor& dy, Stash& stash) {
  return backward_input_steps(ctx, dy, stash).run();
}

Steps<Tensor> MoeMlp::forward_steps(const MicrobatchContext& ctx, Tensor x, std::unique_ptr<Stash>& out) {
  if (ctx.storage != DType::F32) fail("{}: mixture-of-experts layers run in fp32 only", name());
  if ((ctx.ep ? ctx.ep->size() : 1) != ep_)
    fail("{}: built for {} expert-parallel ranks, run with {}", name(), ep_, ctx.ep ? ctx.ep->size() : 1);
  if ((ctx.tp ? ctx.tp->size() : 1) != tp_)
    fail("{}: built for {} tensor-parallel ranks, run with {}", name(), tp_, ctx.tp ? ctx.tp->size() : 1);
  Backend& be = *ctx.backend;
  const int N = ctx.B * ctx.T, C = C_, F = F_;
  auto s = std::make_unique<MoeStash>();
  s->x = x;
  s->n = f32(ctx, N, C);
  s->rstd = Tensor::empty(*ctx.pool, {N});
  be.rmsnorm_forward(s->n.f32(), s->rstd.f32(), x.f32(), weight_of(normw_), N, C, eps_);
  // Route on the host.
  const Tensor logits = f32(ctx, N, E_);
  be.gemm(false, true, N, E_, C, 1.0f, s->n.f32(), C, weight_of(routerw_), C, 0.0f, logits.f32(), E_);
  s->host_logits.resize(static_cast<size_t>(N) * E_);
  be.to_host(s->host_logits.data(), logits.raw(), s->host_logits.size() * sizeof(float));
  std::vector<float> bias;
  if (bias_) {
    bias.resize(static_cast<size_t>(E_));
    be.to_host(bias.data(), bias_->value.raw(), bias.size() * sizeof(float));
  }
  s->routing = route_tokens(s->host_logits.data(), bias_ ? bias.data() : nullptr, N, spec_);
  const Routing& r = s->routing;
  last_ = {r.load_balance, r.z, r.max_over_mean_load()};
  s->rows = upload(ctx, r.row, DType::I32);
  s->source = upload(ctx, r.source, DType::I32);
  s->row_weight = upload(ctx, r.row_weight, DType::F32);
  // The rows to their experts (ep > 1: to their ranks), each expert over its contiguous rows.
  const int R = r.rows();  // N k, less what capacity dropped
  Tensor routed = f32(ctx, R, C);
  be.gather_rows(routed.f32(), s->n.f32(), s->source.i32(), nullptr, R, C);
  s->exchange = std::make_unique<ExpertExchange>(r, ctx.ep, be, *ctx.pool);
  co_await s->exchange->settle();
  const ExpertSpans& local = s->exchange->local();
  s->xp = co_await s->exchange->dispatch(routed, ctx.ep);
  routed = {};
  const ExpertExchange& ex = *s->exchange;
  s->g = ex.local_tensor(F), s->u = ex.local_tensor(F), s->a = ex.local_tensor(F);
  Tensor o = ex.local_tensor(C);
  each_expert(local, C, F, [&](const ExpertRows& x) {
    swiglu_rows(be, x.rows, F, C, s->xp.f32() + x.rc, weight_of(gatew_) + x.w, weight_of(upw_) + x.w, s->g.f32() + x.rf,
                s->u.f32() + x.rf, s->a.f32() + x.rf);
    be.gemm(false, true, x.rows, C, F, 1.0f, s->a.f32() + x.rf, F, weight_of(downw_) + x.w, F, 0.0f, o.f32() + x.rc, C);
    ctx.between_products();
  });
  s->o = co_await s->exchange->combine(o, ctx.ep);
  // y = x + shared experts + the routed outputs, each token's in choice order. Under tp each
  // rank's are its columns' partial sums: summed over the tp ranks, then x joins.
  Tensor y = f32(ctx, N, C);
  const bool tp = tensor_parallel(ctx);
  if (tp)
    be.fill(y.f32(), 0.0f, static_cast<size_t>(N) * C);
  else
    be.copy(y.f32(), x.f32(), static_cast<size_t>(N) * C * sizeof(float));
  if (SF_ > 0) {
    s->sg = f32(ctx, N, SF_), s->su = f32(ctx, N, SF_), s->sa = f32(ctx, N, SF_);
    swiglu_rows(be, N, SF_, C, s->n.f32(), weight_of(*sgatew_), weight_of(*supw_), s->sg.f32(), s->su.f32(),
                s->sa.f32());
    be.gemm(false, true, N, C, SF_, 1.0f, s->sa.f32(), SF_, weight_of(*sdownw_), SF_, 1.0f, y.f32(), C);
  }
  be.combine_rows(y.f32(), s->o.f32(), s->rows.i32(), s->row_weight.f32(), N, spec_.top_k, C);
  if (tp) {
    tp_allreduce(ctx, y);
    be.accumulate(y.f32(), x.f32(), static_cast<size_t>(N) * C);
  }
  out = std::move(s);
  co_return y;
}

// dy -> the routed rows' gradients (weighted) and the weights' (dots) -> each expert's
// SwiGLU backward -> dn (combined back, plus the shared experts' and the router's) -> dx.
Steps<Tensor> MoeMlp::backward_input_steps(const MicrobatchContext& ctx, Tensor dy, Stash& stash) {
  Backend& be = *ctx.backend;
  auto& s = dynamic_cast<MoeStash&>(stash);
  const Routing& r = s.routing;
  const int N = ctx.B * ctx.T, C = C_, F = F_, k = spec_.top_k, R = N * k;
  if (ctx.moe) ctx.moe->add(index_, r);  // once per microbatch (a recomputed forward runs twice)
  s.dy = dy;
  Tensor dout = f32(ctx, r.rows(), C);
  be.gather_rows(dout.f32(), dy.f32(), s.source.i32(), s.row_weight.f32(), r.rows(), C);
  Tensor dweight = Tensor::empty(*ctx.pool, {static_cast<int64_t>(R)});
  be.row_dots(dweight.f32(), dy.f32(), s.o.f32(), s.rows.i32(), N, k, C);
  tp_allreduce(ctx, dweight);  // under tp, o holds each rank's partial sums
  s.o = {};
  // Each expert (ep > 1: on its rank): dh = dout Down_e, then the SwiGLU and its two
  // products into the rows' dxp, which return to their tokens' ranks.
  const ExpertSpans& local = s.exchange->local();
  s.dout = co_await s.exchange->dispatch(dout, ctx.ep);
  dout = {};
  s.dg = s.exchange->local_tensor(F), s.du = s.exchange->local_tensor(F);
  Tensor dxp = s.exchange->local_tensor(C);
  each_expert(local, C, F, [&](const ExpertRows& x) {
    be.gemm(false, false, x.rows, F, C, 1.0f, s.dout.f32() + x.rc, C, weight_of(downw_) + x.w, F, 0.0f,
            s.dg.f32() + x.rf, F);
    swiglu_rows_backward(be, x.rows, F, C, s.g.f32() + x.rf, s.u.f32() + x.rf, weight_of(gatew_) + x.w,
                         weight_of(upw_) + x.w, s.dg.f32() + x.rf, s.du.f32() + x.rf, 0.0f, dxp.f32() + x.rc);
    ctx.between_products();
  });
  s.g = {}, s.u = {};
  dxp = co_await s.exchange->combine(dxp, ctx.ep);
  s.dn = f32(ctx, N, C);
  be.fill(s.dn.f32(), 0.0f, static_cast<size_t>(N) * C);
  be.combine_rows(s.dn.f32(), dxp.f32(), s.rows.i32(), nullptr, N, k, C);
  dxp = {};
  if (SF_ > 0) {
    s.dsg = f32(ctx, N, SF_), s.dsu = f32(ctx, N, SF_);
    be.gemm(false, false, N, SF_, C, 1.0f, dy.f32(), C, weight_of(*sdownw_), SF_, 0.0f, s.dsg.f32(), SF_);
    swiglu_rows_backward(be, N, SF_, C, s.sg.f32(), s.su.f32(), weight_of(*sgatew_), weight_of(*supw_), s.dsg.f32(),
                         s.dsu.f32(), 1.0f, s.dn.f32());
    s.sg = {}, s.su = {};
  }
  tp_allreduce(ctx, s.dn);  // the experts' parts, each rank's columns'; the router's is whole
  // The router: the weights' gradient and the auxiliary losses', each microbatch's losses
  // weighing 1/m of the objective (loss_scale N: the tokens' 1/(m N) times N).
  std::vector<float> host_dw(static_cast<size_t>(R)), host_dl(static_cast<size_t>(N) * E_);
  be.to_host(host_dw.data(), dweight.raw(), host_dw.size() * sizeof(float));
  router_backward(r, s.host_logits.data(), host_dw.data(), spec_, static_cast<double>(ctx.loss_scale) * N,
                  host_dl.data());
  s.dlogits = upload(ctx, host_dl, DType::F32);
  be.gemm(false, false, N, C, E_, 1.0f, s.dlogits.f32(), E_, weight_of(routerw_), C, 1.0f, s.dn.f32(), C);
  Tensor dx = f32(ctx, N, C);
  be.copy(dx.f32(), dy.f32(), static_cast<size_t>(N) * C * sizeof(float));
  be.rmsnorm_backward_input(dx.f32(), s.dn.f32(), s.x.f32(), weight_of(normw_), s.rstd.f32(), N, C);
  co_return dx;
}

void MoeMlp::backward_weight(const MicrobatchContext& ctx, Stash& stash) {
  Backend& be = *ctx.backend;
  auto& s = dynamic_cast<MoeStash&>(stash);
  const int N = ctx.B * ctx.T, C = C_, F = F_;
  each_expert(s.exchange->local(), C, F, [&](const ExpertRows& x) {
    be.gemm(true, false, C, F, x.rows, 1.0f, s.dout.f32() + x.rc, C, s.a.f32() + x.rf, F, 1.0f, downw_.grad.f32() + x.w,
            F);
    be.gemm(true, false, F, C, x.rows, 1.0f, s.dg.f32() + x.rf, F, s.xp.f32() + x.rc, C, 1.0f, gatew_.grad.f32() + x.w,
            C);
    be.gemm(true, false, F, C, x.rows, 1.0f, s.du.f32() + x.rf, F, s.xp.f32() + x.rc, C, 1.0f, upw_.grad.f32() + x.w,
            C);
    ctx.between_products();
  });
  if (SF_ > 0) {
    be.gemm(true, false, C, SF_, N, 1.0f, s.dy.f32(), C, s.sa.f32(), SF_, 1.0f, sdownw_->grad.f32(), SF_);
    be.gemm(true, false, SF_, C, N, 1.0f, s.dsg.f32(), SF_, s.n.f32(), C, 1.0f, sgatew_->grad.f32(), C);
    be.gemm(true, false, SF_, C, N, 1.0f, s.dsu.f32(), SF_, s.n.f32(), C, 1.0f, supw_->grad.f32(), C);
  }
  be.gemm(true, false, E_, C, N, 1.0f, s.dlogits.f32(), E_, s.n.f32(), C, 1.0f, routerw_.grad.f32(), C);
  be.rmsnorm_backward_weight(normw_.grad.f32(), s.dn.f32(), s.x.f32(), s.rstd.f32(), N, C);
}

}  // namespace pipetrain
