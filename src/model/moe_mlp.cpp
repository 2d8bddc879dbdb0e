// The mixture-of-experts MLP half (pipetrain/model/moe_mlp.hpp): forward, the two
// backward halves. The backend routes (Backend::moe_route: the arrays stay on its device,
// the counts and losses come to the host, which sizes the exchange and the products from
// them) and differentiates the router (moe_router_backward). Products are grouped, one per
// expert over its rows (Backend::gemm_grouped: an sgemm each on the CPU, one cuBLAS grouped
// call on CUDA); under bf16 they read the weights' rounded values and the stored
// activations, as the dense layers' f32 products do (precision.hpp), and the routed rows
// travel as f32.
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

using namespace layer_util;

namespace {

// Activations and gradients as stored (precision.hpp: bf16 under train.precision = "bf16").
struct MoeStash : Stash {
  Tensor x, rstd, n;  // input, RMSNorm's, its output
  RouteCounts routing;                             // on the host
  Tensor logits, scores, expert, weight, chosen;   // the router's logits and its choices (routed_arrays)
  std::unique_ptr<ExpertExchange> exchange;        // this rank's experts' rows (ep > 1: from every ep rank)
  Tensor rows, source, row_weight;                 // the routed rows' (routed_arrays)
  Tensor xp, g, u, a;                              // this rank's experts' rows: inputs, gate, up, SwiGLU
  Tensor o;                                        // the routed rows' expert outputs, back in sorted order
  Tensor sg, su, sa;                               // the shared experts' gate, up, SwiGLU (N, S F)
  Tensor dy, dn, dlogits, dout, dg, du, dsg, dsu;  // backward_input, kept for backward_weight (dout, dg,
                                                   // du: this rank's experts' rows)
};

std::string key(int layer, const char* leaf) { return "h." + std::to_string(layer) + "." + leaf; }

Tensor f32(const MicrobatchContext& ctx, int64_t rows, int64_t cols) { return Tensor::empty(*ctx.pool, {rows, cols}); }

Tensor i32(const MicrobatchContext& ctx, int64_t n) { return Tensor::empty(*ctx.pool, {n}, DType::I32); }

// The routing's arrays in the stash (backend/moe_routing.hpp).
RoutedArrays routed_arrays(const MoeStash& s) {
  return {s.scores.f32(), s.expert.i32(),     s.weight.f32(), s.rows.i32(),
          s.source.i32(), s.row_weight.f32(), s.chosen.i32()};
}

// The weights products read (precision.hpp): under bf16 their rounded values, widened.
const float* weight_of(const Parameter& p) { return compute_weight(p).f32(); }

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

Parameter& declare_experts(ParameterStore& p, const std::string& name, std::vector<int64_t> shape, Shard shard,
                           ExpertParallel ep, double std) {
  Parameter& w = p.declare_shard(name, std::move(shape), std::move(shard), Init::Normal, std);
  w.expert_parallel = ep.size > 1;
  w.f32_products = true;
  return w;
}

// This rank's experts over their rows s.xp: gate and up products, stored (rounded in place
// under bf16: the SwiGLU sees the stored values), the SwiGLU, stored, then the down
// products, each expert's into its rows of the result (rows, C).
Tensor experts_forward(const MicrobatchContext& ctx, MoeStash& s, const Parameter& gate, const Parameter& up,
                       const Parameter& down, int C, int F) {
  Backend& be = *ctx.backend;
  const ExpertExchange& ex = *s.exchange;
  const Tensor g = ex.local_tensor(F), u = ex.local_tensor(F), a = ex.local_tensor(F), o = ex.local_tensor(C);
  const float* xp = s.xp.f32();
  const auto between = [&] { ctx.between_products(); };
  std::vector<GemmProblem> pg, pu, pd;
  each_expert(ex.local(), C, F, [&](const ExpertRows& e) {
    pg.push_back({e.rows, F, C, xp + e.rc, C, weight_of(gate) + e.w, C, g.f32() + e.rf, F});
    pu.push_back({e.rows, F, C, xp + e.rc, C, weight_of(up) + e.w, C, u.f32() + e.rf, F});
    pd.push_back({e.rows, C, F, a.f32() + e.rf, F, weight_of(down) + e.w, F, o.f32() + e.rc, C});
  });
  be.gemm_grouped(false, true, 1.0f, 0.0f, pg, between);
  be.gemm_grouped(false, true, 1.0f, 0.0f, pu, between);
  s.g = store(ctx, g), s.u = store(ctx, u);
  be.swiglu_forward(a.f32(), g.f32(), u.f32(), static_cast<size_t>(a.numel()));
  s.a = store(ctx, a);
  be.gemm_grouped(false, true, 1.0f, 0.0f, pd, between);
  return o;
}

// Their input gradient from the routed rows' output gradients dout (rows, C), stored for
// backward_weight with the SwiGLU's dg and du: dh = dout Down_e, the SwiGLU backward, then
// dxp = dg Gate_e + du Up_e.
Tensor experts_backward(const MicrobatchContext& ctx, MoeStash& s, const Tensor& dout, const Parameter& gate,
                        const Parameter& up, const Parameter& down, int C, int F) {
  Backend& be = *ctx.backend;
  const ExpertExchange& ex = *s.exchange;
  s.dout = store(ctx, dout);
  const Tensor dg = ex.local_tensor(F), du = ex.local_tensor(F), dxp = ex.local_tensor(C);
  std::vector<GemmProblem> pd, pg, pu;
  each_expert(ex.local(), C, F, [&](const ExpertRows& e) {
    pd.push_back({e.rows, F, C, dout.f32() + e.rc, C, weight_of(down) + e.w, F, dg.f32() + e.rf, F});
    pg.push_back({e.rows, C, F, dg.f32() + e.rf, F, weight_of(gate) + e.w, C, dxp.f32() + e.rc, C});
    pu.push_back({e.rows, C, F, du.f32() + e.rf, F, weight_of(up) + e.w, C, dxp.f32() + e.rc, C});
  });
  be.gemm_grouped(false, false, 1.0f, 0.0f, pd);
  be.swiglu_backward(dg.f32(), du.f32(), dg.f32(), working_f32(ctx, s.g).f32(), working_f32(ctx, s.u).f32(),
                     static_cast<size_t>(dg.numel()));
  s.dg = store(ctx, dg), s.du = store(ctx, du);
  const auto between = [&] { ctx.between_products(); };
  be.gemm_grouped(false, false, 1.0f, 0.0f, pg, between);  // dxp = dg Gate_e, then + du Up_e
  be.gemm_grouped(false, false, 1.0f, 1.0f, pu, between);
  return dxp;
}

// The shared experts, one SwiGLU of width SF over every token's n: y += their output; the
// gate, up and SwiGLU stored as the routed experts' are.
void shared_forward(const MicrobatchContext& ctx, MoeStash& s, const Tensor& n, const Parameter& gate,
                    const Parameter& up, const Parameter& down, const Tensor& y, int N, int C, int SF) {
  Backend& be = *ctx.backend;
  const Tensor g = f32(ctx, N, SF), u = f32(ctx, N, SF), a = f32(ctx, N, SF);
  be.gemm(false, true, N, SF, C, 1.0f, n.f32(), C, weight_of(gate), C, 0.0f, g.f32(), SF);
  be.gemm(false, true, N, SF, C, 1.0f, n.f32(), C, weight_of(up), C, 0.0f, u.f32(), SF);
  s.sg = store(ctx, g), s.su = store(ctx, u);
  be.swiglu_forward(a.f32(), g.f32(), u.f32(), static_cast<size_t>(a.numel()));
  s.sa = store(ctx, a);
  be.gemm(false, true, N, C, SF, 1.0f, a.f32(), SF, weight_of(down), SF, 1.0f, y.f32(), C);
}

// Their input gradient: dn += dsg Gate + dsu Up, from dy's dsa = dy Down.
void shared_backward(const MicrobatchContext& ctx, MoeStash& s, const Tensor& dy, const Parameter& gate,
                     const Parameter& up, const Parameter& down, const Tensor& dn, int N, int C, int SF) {
  Backend& be = *ctx.backend;
  const Tensor dg = f32(ctx, N, SF), du = f32(ctx, N, SF);
  be.gemm(false, false, N, SF, C, 1.0f, dy.f32(), C, weight_of(down), SF, 0.0f, dg.f32(), SF);
  be.swiglu_backward(dg.f32(), du.f32(), dg.f32(), working_f32(ctx, s.sg).f32(), working_f32(ctx, s.su).f32(),
                     static_cast<size_t>(dg.numel()));
  s.dsg = store(ctx, dg), s.dsu = store(ctx, du);
  be.gemm(false, false, N, C, SF, 1.0f, dg.f32(), SF, weight_of(gate), C, 1.0f, dn.f32(), C);
  be.gemm(false, false, N, C, SF, 1.0f, du.f32(), SF, weight_of(up), C, 1.0f, dn.f32(), C);
  s.sg = {}, s.su = {};
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
            cfg.capacity_factor,
            cfg.router_force_balance},
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
  routerw_.f32_products = true;
  if (cfg.router_bias_rate > 0) {
    bias_ = &p.declare(selection_bias_name(index), {E_}, Init::Zeros);
    bias_->trained = bias_->updated = false;
  }
  if (SF_ > 0) {
    const int64_t SF = int64_t{SF_} * tp.size;
    sgatew_ = &p.declare_shard(key(index, "moe.shared_gate.w"), {SF, C_}, tp_slice(0, SF, tp), Init::Normal, 0.02);
    supw_ = &p.declare_shard(key(index, "moe.shared_up.w"), {SF, C_}, tp_slice(0, SF, tp), Init::Normal, 0.02);
    sdownw_ = &p.declare_shard(key(index, "moe.shared_down.w"), {C_, SF}, tp_slice(1, SF, tp), Init::Normal,
                               0.02 / std::sqrt(2.0 * cfg.n_layer));
    sgatew_->f32_products = supw_->f32_products = sdownw_->f32_products = true;
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

// The router's choices for n (N, C): its logits and the arrays in the stash, the counts
// and losses returned.
RouteCounts MoeMlp::route(const MicrobatchContext& ctx, const Tensor& n, Stash& stash) const {
  auto& s = static_cast<MoeStash&>(stash);
  const int N = ctx.B * ctx.T, C = C_;
  const int64_t pairs = int64_t{N} * spec_.top_k;
  s.logits = f32(ctx, N, E_);
  ctx.backend->gemm(false, true, N, E_, C, 1.0f, n.f32(), C, weight_of(routerw_), C, 0.0f, s.logits.f32(), E_);
  s.scores = f32(ctx, N, E_);
  s.expert = i32(ctx, pairs), s.weight = Tensor::empty(*ctx.pool, {pairs}), s.chosen = i32(ctx, int64_t{E_} + 1);
  s.rows = i32(ctx, pairs), s.source = i32(ctx, pairs), s.row_weight = Tensor::empty(*ctx.pool, {pairs});
  return ctx.backend->moe_route(routed_arrays(s), s.logits.f32(), bias_ ? bias_->value.f32() : nullptr, N, spec_,
                                *ctx.pool);
}

Steps<Tensor> MoeMlp::forward_steps(const MicrobatchContext& ctx, Tensor x, std::unique_ptr<Stash>& out) {
  if ((ctx.ep ? ctx.ep->size() : 1) != ep_)
    fail("{}: built for {} expert-parallel ranks, run with {}", name(), ep_, ctx.ep ? ctx.ep->size() : 1);
  if ((ctx.tp ? ctx.tp->size() : 1) != tp_)
    fail("{}: built for {} tensor-parallel ranks, run with {}", name(), tp_, ctx.tp ? ctx.tp->size() : 1);
  Backend& be = *ctx.backend;
  const int N = ctx.B * ctx.T, C = C_;
  auto s = std::make_unique<MoeStash>();
  const Tensor xf = working_f32(ctx, x);
  s->x = x;
  Tensor n = f32(ctx, N, C);
  s->rstd = Tensor::empty(*ctx.pool, {N});
  be.rmsnorm_forward(n.f32(), s->rstd.f32(), xf.f32(), weight_of(normw_), N, C, eps_);
  s->n = store(ctx, n);  // under bf16 n now holds the stored values: what follows reads those
  s->routing = route(ctx, n, *s);
  const RouteCounts& r = s->routing;
  last_ = {r.load_balance, r.z, r.max_over_mean_load()};
  // The rows to their experts (ep > 1: to their ranks), each expert over its contiguous rows.
  const int R = r.rows();  // N k, less what capacity dropped
  // The counts travel during the gather.
  s->exchange = std::make_unique<ExpertExchange>(r, ctx.ep, be, *ctx.pool, &exchange_rows_);
  Tensor routed = f32(ctx, R, C);
  be.gather_rows(routed.f32(), n.f32(), s->source.i32(), nullptr, R, C);
  co_await s->exchange->settle();
  s->xp = co_await s->exchange->dispatch(routed, ctx.ep);
  routed = {};
  Tensor o = experts_forward(ctx, *s, gatew_, upw_, downw_, C, F_);
  s->xp = store(ctx, s->xp);
  o = co_await s->exchange->combine(o, ctx.ep);
  // y = x + shared experts + the routed outputs, each token's in choice order. Under tp each
  // rank's are its columns' partial sums: summed over the tp ranks, then x joins.
  Tensor y = f32(ctx, N, C);
  const bool tp = tensor_parallel(ctx);
  if (tp)
    be.fill(y.f32(), 0.0f, static_cast<size_t>(N) * C);
  else
    be.copy(y.f32(), xf.f32(), static_cast<size_t>(N) * C * sizeof(float));
  if (SF_ > 0) shared_forward(ctx, *s, n, *sgatew_, *supw_, *sdownw_, y, N, C, SF_);
  be.combine_rows(y.f32(), o.f32(), s->rows.i32(), s->row_weight.f32(), N, spec_.top_k, C);
  s->o = store(ctx, o);
  if (tp) {
    tp_allreduce(ctx, y);
    be.accumulate(y.f32(), xf.f32(), static_cast<size_t>(N) * C);
  }
  out = std::move(s);
  co_return store(ctx, y);
}

// dy -> the routed rows' gradients (weighted) and the weights' (dots) -> each expert's
// SwiGLU backward -> dn (combined back, plus the shared experts' and the router's) -> dx.
Steps<Tensor> MoeMlp::backward_input_steps(const MicrobatchContext& ctx, Tensor dy, Stash& stash) {
  Backend& be = *ctx.backend;
  auto& s = dynamic_cast<MoeStash&>(stash);
  const RouteCounts& r = s.routing;
  const int N = ctx.B * ctx.T, C = C_, k = spec_.top_k, R = N * k;
  if (ctx.moe) ctx.moe->add(index_, r);  // once per microbatch (a recomputed forward runs twice)
  const Tensor dyf = working_f32(ctx, dy);
  s.dy = dy;
  Tensor dout = f32(ctx, r.rows(), C);
  be.gather_rows(dout.f32(), dyf.f32(), s.source.i32(), s.row_weight.f32(), r.rows(), C);
  Tensor dweight = Tensor::empty(*ctx.pool, {static_cast<int64_t>(R)});
  be.row_dots(dweight.f32(), dyf.f32(), working_f32(ctx, s.o).f32(), s.rows.i32(), N, k, C);
  tp_allreduce(ctx, dweight);  // under tp, o holds each rank's partial sums
  s.o = {};
  // Each expert (ep > 1: on its rank), its rows' input gradients back to their tokens' ranks.
  dout = co_await s.exchange->dispatch(dout, ctx.ep);
  Tensor dxp = experts_backward(ctx, s, dout, gatew_, upw_, downw_, C, F_);
  dout = {};
  s.g = {}, s.u = {};
  dxp = co_await s.exchange->combine(dxp, ctx.ep);
  Tensor dn = f32(ctx, N, C);
  be.fill(dn.f32(), 0.0f, static_cast<size_t>(N) * C);
  be.combine_rows(dn.f32(), dxp.f32(), s.rows.i32(), nullptr, N, k, C);
  dxp = {};
  if (SF_ > 0) shared_backward(ctx, s, dyf, *sgatew_, *supw_, *sdownw_, dn, N, C, SF_);
  tp_allreduce(ctx, dn);  // the experts' parts, each rank's columns'; the router's is whole
  // The router: the weights' gradient and the auxiliary losses', each microbatch's losses
  // weighing 1/m of the objective (loss_scale N: the tokens' 1/(m N) times N).
  s.dlogits = f32(ctx, N, E_);
  be.moe_router_backward(s.dlogits.f32(), routed_arrays(s), s.logits.f32(), dweight.f32(), N, spec_,
                         static_cast<double>(ctx.loss_scale) * N);
  s.logits = {}, s.scores = {}, s.expert = {}, s.weight = {}, s.chosen = {};
  be.gemm(false, false, N, C, E_, 1.0f, s.dlogits.f32(), E_, weight_of(routerw_), C, 1.0f, dn.f32(), C);
  s.dn = store(ctx, dn);
  Tensor dx = f32(ctx, N, C);
  be.copy(dx.f32(), dyf.f32(), static_cast<size_t>(N) * C * sizeof(float));
  be.rmsnorm_backward_input(dx.f32(), dn.f32(), working_f32(ctx, s.x).f32(), weight_of(normw_), s.rstd.f32(), N, C);
  co_return store(ctx, dx);
}

void MoeMlp::backward_weight(const MicrobatchContext& ctx, Stash& stash) {
  Backend& be = *ctx.backend;
  auto& s = dynamic_cast<MoeStash&>(stash);
  const int N = ctx.B * ctx.T, C = C_, F = F_;
  const Tensor dout = working_f32(ctx, s.dout), a = working_f32(ctx, s.a), dg = working_f32(ctx, s.dg),
               du = working_f32(ctx, s.du), xp = working_f32(ctx, s.xp);
  std::vector<GemmProblem> pd, pg, pu;
  each_expert(s.exchange->local(), C, F, [&](const ExpertRows& x) {
    pd.push_back({C, F, x.rows, dout.f32() + x.rc, C, a.f32() + x.rf, F, downw_.grad.f32() + x.w, F});
    pg.push_back({F, C, x.rows, dg.f32() + x.rf, F, xp.f32() + x.rc, C, gatew_.grad.f32() + x.w, C});
    pu.push_back({F, C, x.rows, du.f32() + x.rf, F, xp.f32() + x.rc, C, upw_.grad.f32() + x.w, C});
  });
  const auto between = [&] { ctx.between_products(); };
  for (const auto* p : {&pd, &pg, &pu}) be.gemm_grouped(true, false, 1.0f, 1.0f, *p, between);
  const Tensor n = working_f32(ctx, s.n);
  if (SF_ > 0) {
    const Tensor dy = working_f32(ctx, s.dy), sa = working_f32(ctx, s.sa), dsg = working_f32(ctx, s.dsg),
                 dsu = working_f32(ctx, s.dsu);
    be.gemm(true, false, C, SF_, N, 1.0f, dy.f32(), C, sa.f32(), SF_, 1.0f, sdownw_->grad.f32(), SF_);
    be.gemm(true, false, SF_, C, N, 1.0f, dsg.f32(), SF_, n.f32(), C, 1.0f, sgatew_->grad.f32(), C);
    be.gemm(true, false, SF_, C, N, 1.0f, dsu.f32(), SF_, n.f32(), C, 1.0f, supw_->grad.f32(), C);
  }
  be.gemm(true, false, E_, C, N, 1.0f, s.dlogits.f32(), E_, n.f32(), C, 1.0f, routerw_.grad.f32(), C);
  be.rmsnorm_backward_weight(normw_.grad.f32(), working_f32(ctx, s.dn).f32(), working_f32(ctx, s.x).f32(), s.rstd.f32(),
                             N, C);
}

}  // namespace pipetrain
