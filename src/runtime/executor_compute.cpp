// PipelineExecutor::Impl's computations (executor_impl.hpp): a stage's forward, backward
// input and backward weight over its layers, with stashes and recomputation.
#include "executor_impl.hpp"
#include "pipetrain/model/sequence_parallel.hpp"

namespace pipetrain {

Tensor PipelineExecutor::Impl::forward_input(const Action& a) {
  fault::point("forward");
  ModelStage& st = stage(a);
  Tensor x;
  if (a.stage > 0) x = take_input(a, {kActivation, a.microbatch, a.stage});
  StageStash& ss = stashes[{a.microbatch, a.stage}];
  ss.ctx = make_context(a.microbatch, a.stage, st);
  if (vocab() && a.stage == 0)  // the slices' lookups, summed
    x = layer_util::store(ss.ctx, collective_result(Coll::EmbedSum, a.microbatch, to_string(a)));
  return x;
}

Steps<> PipelineExecutor::Impl::forward(Action a, bool frees, Communicator* ep) {
  Tensor x = forward_input(a);
  ModelStage& st = stage(a);
  StageStash& ss = stash_of(a);
  ss.ctx.ep = ep;
  auto& layers = st.layers();
  ss.layers.resize(layers.size());
  ss.inputs.resize(layers.size());
  const bool full = ss.ctx.recompute == Recompute::Full && ss.ctx.loss_scale != 0;  // evaluation keeps nothing anyway
  const bool sp = layer_util::sequence_sharded(ss.ctx);
  bool rows = sp && a.stage > 0;  // a received input: this rank's rows
  for (size_t i = 0; i < layers.size(); ++i) {
    const bool again = full && layers[i]->recomputable();
    const bool want = layer_util::takes_rows(ss.ctx, *layers[i]);
    x = layer_util::to_rows(ss.ctx, x, rows, want);
    rows = want;
    if (again) ss.inputs[i] = x;
    unit_work(a, static_cast<int>(i));
    x = co_await layers[i]->forward_steps(ss.ctx, x, ss.layers[i]);
    if (again) ss.layers[i].reset();  // only the input stays: forward runs again at backward_input
    unit_done(static_cast<int>(i));
    between_layers();
  }
  if (st.has_head() && !vocab()) {
    const int64_t n = x.numel();
    ex.backend_.copy(losses.view(losses_kept * n, {n}).raw(), x.raw(), x.bytes());
    ++losses_kept;
  }
  stats.peak_stashed = std::max(stats.peak_stashed, static_cast<int>(stashes.size()));
  if (frees) stashes.erase({a.microbatch, a.stage});  // forward only: nothing to keep
  if (st.has_head() && vocab())                       // the final norm's output, for every rank's output slice
    hidden[a.microbatch] = layer_util::to_rows(ss.ctx, x, rows, false);
  else if (!st.has_head())
    outputs.emplace(Key{kActivation, a.microbatch, a.stage + 1}, layer_util::to_rows(ss.ctx, x, rows, sp));
}

StageStash& PipelineExecutor::Impl::stash_of(const Action& a) {
  auto it = stashes.find({a.microbatch, a.stage});
  if (it == stashes.end()) fail("rank {}: {} runs before the forward of its microbatch", me, to_string(a));
  return it->second;
}

Tensor PipelineExecutor::Impl::backward_input_gradient(const Action& a) {
  fault::point("backward");
  ModelStage& st = stage(a);
  StageStash& ss = stash_of(a);
  if (!st.has_head()) return take_input(a, {static_cast<int>(Transfer::Gradient), a.microbatch, a.stage});
  if (!vocab()) return {};
  const Tensor merged = collective_result(Coll::HiddenGrad, a.microbatch, to_string(a));
  Tensor dx = Tensor::empty(ex.pool_, {merged.shape()[0], static_cast<int64_t>(ex.d_model_)});
  VocabSlice::hidden_grad(ss.ctx, merged, dx);
  return layer_util::store(ss.ctx, dx);
}

Steps<> PipelineExecutor::Impl::backward_input(Action a, bool frees, size_t index) {
  Tensor dy = backward_input_gradient(a);
  ModelStage& st = stage(a);
  StageStash& ss = stash_of(a);
  ss.ctx.ep = ex.ep_backward_;
  auto& layers = st.layers();
  const bool sp = layer_util::sequence_sharded(ss.ctx);
  bool rows = sp && !st.has_head();  // a received gradient: this rank's rows
  size_t deferred = 0;               // this B's items in weight_work (FIFO: the older run first)
  for (size_t i = layers.size(); i-- > 0;) {
    const bool want = layer_util::takes_rows(ss.ctx, *layers[i]);
    dy = layer_util::to_rows(ss.ctx, dy, rows, want);
    rows = want;
    unit_work(a, static_cast<int>(i));
    if (!ss.layers[i]) {  // full recomputation: the same forward on the same input
      co_await layers[i]->forward_steps(ss.ctx, ss.inputs[i], ss.layers[i]);
      ss.inputs[i] = {};
    }
    dy = co_await layers[i]->backward_input_steps(ss.ctx, dy, *ss.layers[i]);
    if (a.op == Op::B) {
      auto weights = [this, a, i, index, frees, &ss, &layers] {
        layers[i]->backward_weight(ss.ctx, *ss.layers[i]);
        weights_done(a, i, index);
        if (frees) ss.layers[i].reset();  // done with this layer: its memory goes back now
      };
      // Filler for exposed exchange waits, each about one product of the peer; the head's
      // (vocabulary × d_model) could outlast many of them, and its peer with it: it runs now,
      // after the older queued ones (a tied embedding's terms stay in program order).
      const bool head = st.has_head() && i + 1 == layers.size();
      if (defer_weights && !head) {
        weight_work.push_back(weights);
        ++deferred;
      } else {
        while (weight_work.size() > deferred) run_weight_work();
        weights();
      }
    } else {
      between_layers();
    }
    unit_done(static_cast<int>(i));
  }
  while (weight_work.size() > deferred) run_weight_work();
  if (a.stage > 0)
    outputs.emplace(Key{static_cast<int>(Transfer::Gradient), a.microbatch, a.stage - 1},
                    layer_util::to_rows(ss.ctx, dy, rows, sp));
  else if (vocab())
    embed_grad[a.microbatch] = layer_util::to_rows(ss.ctx, dy, rows, false);  // for every rank's embedding slice
  if (frees && deferred > 0)                                                  // behind its weight gradients
    weight_work.push_back([this, key = std::pair{a.microbatch, a.stage}] { stashes.erase(key); });
  else if (frees)
    stashes.erase({a.microbatch, a.stage});
}

void PipelineExecutor::Impl::backward_weight(const Action& a, bool frees, size_t index) {
  fault::point("backward");
  ModelStage& st = stage(a);
  const double c0 = now();
  StageStash& ss = stash_of(a);
  auto& layers = st.layers();
  for (size_t i = layers.size(); i-- > 0;) {
    unit_work(a, static_cast<int>(i));
    layers[i]->backward_weight(ss.ctx, *ss.layers[i]);
    weights_done(a, i, index);
    if (frees) ss.layers[i].reset();
    unit_done(static_cast<int>(i));
  }
  if (frees) stashes.erase({a.microbatch, a.stage});
  compute_done(to_string(a), c0);
}

Steps<> PipelineExecutor::Impl::compute(const Instr& in, size_t index, bool beside_forward) {
  if (in.action.op == Op::F) return forward(in.action, in.frees_stash, beside_forward ? ex.ep_backward_ : ex.ep_);
  return backward_input(in.action, in.frees_stash, index);
}

void PipelineExecutor::Impl::shard(const Instr& in) {
  if (!hooks.shard) fail("{}: a shard instruction, but this run shards nothing", to_string(in));
  hooks.shard(in);
}

void PipelineExecutor::Impl::take_inside(const std::vector<Instr>& program, size_t i) {
  inside.clear();
  inside_next = 0;
  for (size_t j = i + 1; j < program.size() && program[j].op == InstrOp::Shard && program[j].at_layer >= 0; ++j)
    inside.push_back(&program[j]);
}

void PipelineExecutor::Impl::inside_done(const Action& a) {
  if (inside_next < inside.size())
    fail("rank {}: {} left {} of its shard instructions unrun", me, to_string(a), inside.size() - inside_next);
}

void PipelineExecutor::Impl::unit_work(const Action& a, int layer) {
  for (; inside_next < inside.size() && inside[inside_next]->at_layer == layer &&
         inside[inside_next]->shard == ShardOp::GatherW;
       ++inside_next)
    shard(*inside[inside_next]);
  // (Evaluation writes no gradients.)
  if (hooks.layer_units) hooks.layer_units(a.stage, layer, a.op != Op::W, a.op != Op::F && loss_scale != 0);
}

void PipelineExecutor::Impl::unit_done(int layer) {
  for (; inside_next < inside.size() && inside[inside_next]->at_layer == layer; ++inside_next)
    shard(*inside[inside_next]);
}

void PipelineExecutor::Impl::run_weight_work() {
  const std::function<void()> work = std::move(weight_work.front());
  weight_work.pop_front();
  work();
}

void PipelineExecutor::Impl::weights_done(const Action& a, size_t layer, size_t index) {
  if (hooks.layer_grads_final && last_weight_action[a.stage] == index)
    hooks.layer_grads_final(a.stage, static_cast<int>(layer));
  between_layers();  // keeps in-flight reductions moving
}

void PipelineExecutor::Impl::compute_done(const std::string& name, double c0, double waited) {
  const double c1 = now();
  stats.compute_s += c1 - c0 - waited;
  if (trace) stats.events.push_back({name, me, c0, c1 - c0});
}

}  // namespace pipetrain
