#include "pipetrain/runtime/executor.hpp"

#include <fmt/format.h>

#include <chrono>
#include <climits>
#include <deque>
#include <optional>

#include "pipetrain/backend/backend.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/core/fault.hpp"
#include "pipetrain/core/watchdog.hpp"
#include "pipetrain/model/precision.hpp"
#include "pipetrain/model/vocab_slice.hpp"

namespace pipetrain {

namespace {

using Clock = std::chrono::steady_clock;

struct Key {
  int kind, microbatch, stage;  // Transfer kind; stage = the consumer
  auto operator<=>(const Key&) const = default;
};
Key key_of(const Instr& i) { return {static_cast<int>(i.kind), i.microbatch, i.stage}; }
constexpr int kActivation = static_cast<int>(Transfer::Activation);

// Everything one (microbatch, stage) keeps between its F and its last backward action.
// Under full recomputation a recomputable layer keeps only its input (inputs[i]) until
// backward_input runs its forward again.
struct StageStash {
  MicrobatchContext ctx;
  std::vector<std::unique_ptr<Stash>> layers;
  std::vector<Tensor> inputs;
};

struct PendingRecv {
  Tensor buffer;
  int peer = -1;
  std::unique_ptr<CommRequest> request;
};

struct PendingSend {
  Tensor buffer;  // kept alive until the send completes
  std::unique_ptr<CommRequest> request;
};

// A posted collective of the vocabulary slices: its buffer, kept until it completes.
struct PendingColl {
  Tensor buffer;
  std::unique_ptr<CommRequest> request;
};

}  // namespace

struct PipelineExecutor::Impl {
  Impl(PipelineExecutor& e, const MicrobatchLoader& l, int b, int t, int rank, float scale, bool tr,
       const ExecutorHooks& h)
      : ex(e), load(l), B(b), T(t), me(rank), loss_scale(scale), trace(tr), hooks(h) {}
  PipelineExecutor& ex;
  const MicrobatchLoader& load;
  int B, T, me;
  float loss_scale;
  bool trace;
  const ExecutorHooks& hooks;
  std::map<int, size_t> last_weight_action;  // stage -> index of its last B or W in the program
  size_t current = 0;                        // index of the running instruction
  Clock::time_point t0 = Clock::now();
  ExecutorStats stats;
  std::map<std::pair<int, int>, StageStash> stashes;  // (microbatch, stage)
  std::map<Key, Tensor> outputs;                      // computed, until their SEND or MOVE
  std::map<Key, Tensor> handoff;                      // moved to a consumer on this rank
  std::map<Key, PendingRecv> recvs;
  std::deque<PendingSend> sends;
  // The step's data, moved once: every microbatch this rank's embedding or head reads
  // (slot[m] is its place in the buffers), and the head's token losses, copied back to the
  // host once at the end — no host synchronisation per microbatch.
  std::map<int, int64_t> slot;
  Tensor tokens, targets, losses;
  int64_t losses_kept = 0;
  // Vocabulary parallelism: each microbatch's slice results until their collective takes
  // them (EF's partial lookup, the last stage's hidden states, OF's softmax partials of their
  // gradient, the first stage's input gradient), the posted collectives, OF's stashes.
  std::map<int, Tensor> partial_lookup, hidden, hidden_grad, embed_grad;
  std::map<std::pair<int, int>, PendingColl> colls;  // (Coll, microbatch), waited for here
  std::deque<PendingColl> contributed;               // given only (unused sums, a root's sends): freed once done
  std::map<int, VocabOutputStash> output_stash;
  CommRequest* partner = nullptr;  // in an F&B pair: the other computation's exchange in flight
  bool vocab() const { return ex.vocab_.slice != nullptr; }

  void load_step_data(const std::vector<Instr>& program) {
    const int64_t n = static_cast<int64_t>(B) * T;
    int64_t heads = 0;
    for (const Instr& in : program) {
      if (vocab() && in.op == InstrOp::Vocab && in.vocab == VocabOp::OutputForward) {  // every rank: every microbatch
        slot.emplace(in.microbatch, static_cast<int64_t>(slot.size()));
        heads += ex.vocab_.holds_last;
        continue;
      }
      if (vocab() || in.op != InstrOp::Compute || in.action.op != Op::F) continue;
      const auto it = ex.stages_.find(in.action.stage);
      if (it == ex.stages_.end() || !(it->second->has_embedding() || it->second->has_head())) continue;
      slot.emplace(in.action.microbatch, static_cast<int64_t>(slot.size()));
      heads += it->second->has_head();
    }
    if (!slot.empty()) {
      const int64_t k = static_cast<int64_t>(slot.size());
      std::vector<int32_t> host_in(static_cast<size_t>(k * n)), host_tgt(static_cast<size_t>(k * n));
      for (const auto& [m, at] : slot) load(m, host_in.data() + at * n, host_tgt.data() + at * n);
      tokens = Tensor::empty(ex.pool_, {k * n}, DType::I32);
      targets = Tensor::empty(ex.pool_, {k * n}, DType::I32);
      ex.backend_.to_device(tokens.raw(), host_in.data(), tokens.bytes());
      ex.backend_.to_device(targets.raw(), host_tgt.data(), targets.bytes());
    }
    if (heads > 0) losses = Tensor::empty(ex.pool_, {heads * n});
  }
  // The head's losses of this run, summed in the order they were computed.
  void sum_losses() {
    if (losses_kept == 0) return;
    std::vector<float> host(static_cast<size_t>(losses_kept * B * T));
    ex.backend_.to_host(host.data(), losses.raw(), host.size() * sizeof(float));
    for (float l : host) stats.loss_sum += l;
  }

  double now() const { return std::chrono::duration<double>(Clock::now() - t0).count(); }

  // Megatron's scatter-gather: every tensor that crosses stages is replicated over the
  // stage's tp ranks, so each tp rank moves only its 1/tp slice between stages and the
  // receiving tp ranks all-gather the whole (bytes per rank divided by tp, values unchanged).
  bool scatter(const Tensor& t) const { return ex.tp_ && ex.tp_->size() > 1 && t.numel() % ex.tp_->size() == 0; }
  Tensor my_slice(const Tensor& t) const {
    const int64_t chunk = t.numel() / ex.tp_->size();
    return t.view(chunk * ex.tp_->rank(), {chunk});
  }

  // RECV: posted now into a pooled buffer, waited on by the compute that needs it.
  void post(const Instr& in) {
    PendingRecv r;
    r.buffer = Tensor::empty(ex.pool_, {static_cast<int64_t>(B) * T, ex.d_model_}, ex.storage_);
    r.peer = in.peer;
    r.request = ex.pp_.recv(scatter(r.buffer) ? my_slice(r.buffer) : r.buffer, in.peer, in.tag, ex.backend_.stream());
    recvs.emplace(key_of(in), std::move(r));
  }

  // SEND: the output goes out as soon as it exists; completed sends free their buffers.
  void send(const Instr& in) {
    Tensor t = take_output(in);
    PendingSend s;
    const Tensor part = scatter(t) ? my_slice(t) : t;
    stats.bytes_sent += static_cast<double>(part.bytes());
    s.request = ex.pp_.send(part, in.peer, in.tag, ex.backend_.stream());
    s.buffer = std::move(t);
    sends.push_back(std::move(s));
    while (!sends.empty() && sends.front().request->test()) sends.pop_front();
  }

  // MOVE: a hand-off to a stage of this rank.
  void move(const Instr& in) { handoff.emplace(key_of(in), take_output(in)); }

  Tensor take_output(const Instr& in) {
    auto it = outputs.find(key_of(in));
    if (it == outputs.end())
      fail("rank {}: instruction {} of the program ({}) has nothing to send", me, current, to_string(in));
    Tensor t = std::move(it->second);
    outputs.erase(it);
    return t;
  }

  // The input of action `a`: handed over on this rank, or a posted receive waited on now.
  Tensor take_input(const Action& a, Key key) {
    if (auto it = handoff.find(key); it != handoff.end()) {
      Tensor t = std::move(it->second);
      handoff.erase(it);
      return t;
    }
    auto it = recvs.find(key);
    if (it == recvs.end())
      fail("rank {}: {} has no input: the program posts no receive and no hand-off for it", me, to_string(a));
    watchdog::set_position(fmt::format(
        "step {}, instruction {} ({}), which needs the {} of {}{}{} from rank {}", hooks.step, current, to_string(a),
        key.kind == kActivation ? "activation" : "gradient", key.kind == kActivation ? key.stage - 1 : key.stage + 1,
        key.kind == kActivation ? 'F' : 'B', key.microbatch, it->second.peer));
    fault::point("p2p-wait");
    // Time this rank would wait: refresh the packed weight copies its next products need
    // (runtime.pack_weights), so that their first products, on the pipeline's critical
    // path, find them ready.
    const double r0 = now();
    const int refreshed = ex.backend_.refresh_packed_weights_until([&] { return it->second.request->test(); });
    if (refreshed > 0) {
      stats.copies_refreshed += refreshed;
      stats.refresh_s += now() - r0;
      stats.compute_s += now() - r0;  // work a product would otherwise do
      if (trace) stats.events.push_back({fmt::format("refresh {} copies", refreshed), me, r0, now() - r0});
    }
    const double w0 = now();
    it->second.request->wait_on(ex.backend_.stream());  // the host waits only where the transport must
    const double w1 = now();
    stats.wait_s += w1 - w0;
    if (trace && w1 - w0 > 1e-6) stats.events.push_back({"wait " + to_string(a), me, w0, w1 - w0});
    Tensor t = std::move(it->second.buffer);
    recvs.erase(it);
    if (scatter(t)) {  // this rank received its slice; the tp peers received theirs
      const double g0 = now();
      ex.tp_->all_gather(my_slice(t), t, ex.backend_.stream())->wait_on(ex.backend_.stream());
      stats.wait_s += now() - g0;
    }
    return t;
  }

  ModelStage& stage(const Action& a) {
    auto it = ex.stages_.find(a.stage);
    if (it == ex.stages_.end())
      fail("rank {}: action {} is for stage {}, which this rank does not hold", me, to_string(a), a.stage);
    return *it->second;
  }

  // What every computation of this run shares: backend, pool, shapes, loss scale, storage.
  MicrobatchContext run_context() const {
    MicrobatchContext ctx;
    ctx.backend = &ex.backend_;
    ctx.pool = &ex.pool_;
    ctx.B = B;
    ctx.T = T;
    ctx.loss_scale = loss_scale;
    ctx.storage = ex.storage_;
    ctx.moe = hooks.moe;
    return ctx;
  }

  MicrobatchContext make_context(int m, int stage, const ModelStage& st) {
    MicrobatchContext ctx = run_context();
    ctx.tp = ex.tp_;
    ctx.ep = ex.ep_;
    ctx.progress = [this] {
      if (partner) partner->test();
    };
    if (auto it = ex.recompute_.find(stage); it != ex.recompute_.end()) ctx.recompute = it->second;
    if (!vocab() && (st.has_embedding() || st.has_head())) {
      const int64_t n = static_cast<int64_t>(B) * T, at = slot.at(m) * n;
      if (st.has_embedding()) ctx.tokens = tokens.view(at, {n});
      if (st.has_head()) ctx.targets = targets.view(at, {n});
    }
    return ctx;
  }

  // ---- vocabulary parallelism ----
  MicrobatchContext vocab_context(int m) {
    MicrobatchContext ctx = run_context();
    const int64_t n = static_cast<int64_t>(B) * T, at = slot.at(m) * n;
    ctx.tokens = tokens.view(at, {n});
    ctx.targets = targets.view(at, {n});
    return ctx;
  }
  Tensor take(std::map<int, Tensor>& from, int m, const Instr& in) {
    auto it = from.find(m);
    if (it == from.end()) fail("rank {}: {} has nothing to carry", me, to_string(in));
    Tensor t = std::move(it->second);
    from.erase(it);
    return t;
  }
  // COLL: posts the collective on this rank's data (or into a buffer for its result).
  void post_collective(const Instr& in) {
    const VocabRun& v = ex.vocab_;
    Communicator& g = *v.group;
    Stream& s = ex.backend_.stream();
    const int m = in.microbatch;
    const int64_t N = static_cast<int64_t>(B) * T, C = ex.d_model_;
    PendingColl c;
    auto sum = [&](Tensor t, int root) {
      c.buffer = std::move(t);
      c.request = v.sums_to_all ? g.allreduce_sum(c.buffer, s) : g.reduce_sum(c.buffer, root, s);
    };
    // A broadcast goes from the root to each rank (program.hpp: awaited_post); the root's
    // own consumer reads the data at once while the sends are in flight.
    auto broadcast = [&](std::map<int, Tensor>& mine, int root) {
      const int tag = 2 * m + (in.coll == Coll::EmbedGrad);
      if (tag > g.tag_ub())
        fail("vocabulary parallelism: microbatch {} needs tag {} > MPI_TAG_UB {}", m, tag, g.tag_ub());
      if (g.rank() != root) {
        c.buffer = Tensor::empty(ex.pool_, {N, C}, ex.storage_);
        c.request = g.recv(c.buffer, root, tag, s);
        return;
      }
      c.buffer = take(mine, m, in);
      for (int q = 0; q < g.size(); ++q)
        if (q != root) contributed.push_back({c.buffer, g.send(c.buffer, q, tag, s)});
    };
    switch (in.coll) {
      case Coll::EmbedSum:
        sum(take(partial_lookup, m, in), v.first_root);
        break;
      case Coll::Hidden:
        broadcast(hidden, v.last_root);
        break;
      case Coll::Stats: {
        c.buffer = std::move(colls.at({static_cast<int>(Coll::Stats), m}).buffer);
        c.request = g.all_gather(c.buffer.view(2 * N * g.rank(), {2, N}), c.buffer, s);
        break;
      }
      case Coll::HiddenGrad:  // every slice's softmax partials, merged
        c.buffer = take(hidden_grad, m, in);
        c.request = g.reduce_softmax_partials(c.buffer, v.sums_to_all ? -1 : v.last_root, s);
        break;
      case Coll::EmbedGrad:
        broadcast(embed_grad, v.first_root);
        break;
    }
    const bool used_here = (in.coll != Coll::EmbedSum || v.holds_first) && (in.coll != Coll::HiddenGrad || v.holds_last);
    if (used_here) {
      colls[{static_cast<int>(in.coll), m}] = std::move(c);
      return;
    }
    contributed.push_back(std::move(c));
    while (!contributed.empty() && contributed.front().request->test()) contributed.pop_front();
  }
  // Between two layers: the dp reducer's poll, and one test of a vocabulary collective in
  // flight. Any test advances every pending request of the process (Open MPI's progress
  // engine), so a collective another rank waits for moves on during this rank's products.
  // (A progress thread woken every millisecond did the same at 10-15% of the step where
  // ranks have no core to spare: bench/RESULTS.md.) In an F&B pair, the paused partner's
  // all-to-all is tested too.
  void between_layers() {
    if (hooks.poll) hooks.poll();
    if (partner) partner->test();
    if (!vocab()) return;
    for (auto& [key, c] : colls)
      if (c.request) {
        c.request->test();
        return;
      }
    if (!contributed.empty()) contributed.front().request->test();
  }
  // The result of a posted collective, waited for now.
  Tensor collective_result(Coll which, int m, const std::string& who) {
    auto it = colls.find({static_cast<int>(which), m});
    if (it == colls.end()) fail("rank {}: {} waits for a collective not posted", me, who);
    if (it->second.request) {  // none: a broadcast's root, whose data is its own
      watchdog::set_position(
          fmt::format("step {}, instruction {} ({}), waiting for the vocabulary collective", hooks.step, current, who));
      const double w0 = now();
      it->second.request->wait_on(ex.backend_.stream());
      stats.wait_s += now() - w0;
    }
    Tensor t = std::move(it->second.buffer);
    colls.erase(it);
    return t;
  }
  // VOCAB: this rank's slice of microbatch m.
  void vocab_piece(const Instr& in) {
    VocabSlice& slice = *ex.vocab_.slice;
    const int m = in.microbatch;
    const int64_t N = static_cast<int64_t>(B) * T, C = ex.d_model_;
    const std::string name = to_string(in);
    MicrobatchContext ctx = vocab_context(m);
    double c0 = now();
    switch (in.vocab) {
      case VocabOp::EmbedForward: {
        Tensor out = Tensor::empty(ex.pool_, {N, C});
        slice.embed_forward(ctx, ctx.tokens, out);
        partial_lookup[m] = std::move(out);
        break;
      }
      case VocabOp::OutputForward: {
        const Tensor x = collective_result(Coll::Hidden, m, name);
        c0 = now();
        const int R = ex.vocab_.group->size();
        Tensor all = Tensor::empty(ex.pool_, {R, 2, N}), partials;
        if (loss_scale != 0) partials = Tensor::empty(ex.pool_, {N, 2 + 2 * C});
        output_stash[m] = slice.output_forward(ctx, x, all.view(2 * N * ex.vocab_.group->rank(), {2, N}),
                                               loss_scale != 0 ? &partials : nullptr);
        colls[{static_cast<int>(Coll::Stats), m}].buffer = std::move(all);
        if (loss_scale != 0) hidden_grad[m] = std::move(partials);
        break;
      }
      case VocabOp::OutputBackward: {
        const Tensor all = collective_result(Coll::Stats, m, name);
        c0 = now();
        const Tensor l = Tensor::empty(ex.pool_, {N});
        slice.output_backward(ctx, output_stash.at(m), all, ex.vocab_.group->size(), l);
        output_stash.erase(m);
        if (ex.vocab_.holds_last) {  // the loss, once: where the last stage runs
          ex.backend_.copy(losses.view(losses_kept * N, {N}).raw(), l.raw(), l.bytes());
          ++losses_kept;
        }
        break;
      }
      case VocabOp::EmbedBackward: {
        const Tensor d = collective_result(Coll::EmbedGrad, m, name);
        c0 = now();
        slice.embed_backward(ctx, ctx.tokens, d);
        break;
      }
    }
    const double c1 = now();
    stats.compute_s += c1 - c0;
    if (trace) stats.events.push_back({name, me, c0, c1 - c0});
  }

  // F's input, waited for now (a receive, a hand-off, or under vocabulary parallelism the
  // slices' lookups), and its stash's context.
  Tensor forward_input(const Action& a) {
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

  Steps<> forward(Action a, bool frees) {
    Tensor x = forward_input(a);
    ModelStage& st = stage(a);
    StageStash& ss = stash_of(a);
    ss.ctx.ep = ex.ep_;
    auto& layers = st.layers();
    ss.layers.resize(layers.size());
    ss.inputs.resize(layers.size());
    const bool full = ss.ctx.recompute == Recompute::Full && ss.ctx.loss_scale != 0;  // evaluation keeps nothing anyway
    for (size_t i = 0; i < layers.size(); ++i) {
      const bool again = full && layers[i]->recomputable();
      if (again) ss.inputs[i] = x;
      x = co_await layers[i]->forward_steps(ss.ctx, x, ss.layers[i]);
      if (again) ss.layers[i].reset();  // only the input stays: forward runs again at backward_input
      between_layers();
    }
    if (st.has_head() && !vocab()) {
      const int64_t n = x.numel();
      ex.backend_.copy(losses.view(losses_kept * n, {n}).raw(), x.raw(), x.bytes());
      ++losses_kept;
    }
    stats.peak_stashed = std::max(stats.peak_stashed, static_cast<int>(stashes.size()));
    if (frees) stashes.erase({a.microbatch, a.stage});  // forward only: nothing to keep
    if (st.has_head() && vocab())
      hidden[a.microbatch] = std::move(x);  // the final norm's output, for every rank's output slice
    else if (!st.has_head())
      outputs.emplace(Key{kActivation, a.microbatch, a.stage + 1}, std::move(x));
  }

  StageStash& stash_of(const Action& a) {
    auto it = stashes.find({a.microbatch, a.stage});
    if (it == stashes.end()) fail("rank {}: {} runs before the forward of its microbatch", me, to_string(a));
    return it->second;
  }

  // B or I's output gradient, waited for now: a receive, a hand-off, or under vocabulary
  // parallelism every slice's softmax partials, merged.
  Tensor backward_input_gradient(const Action& a) {
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

  // B or I; `index`: its place in the program.
  Steps<> backward_input(Action a, bool frees, size_t index) {
    Tensor dy = backward_input_gradient(a);
    ModelStage& st = stage(a);
    StageStash& ss = stash_of(a);
    ss.ctx.ep = ex.ep_backward_;
    auto& layers = st.layers();
    for (size_t i = layers.size(); i-- > 0;) {
      if (!ss.layers[i]) {  // full recomputation: the same forward on the same input
        co_await layers[i]->forward_steps(ss.ctx, ss.inputs[i], ss.layers[i]);
        ss.inputs[i] = {};
      }
      dy = co_await layers[i]->backward_input_steps(ss.ctx, dy, *ss.layers[i]);
      if (a.op == Op::B) {
        layers[i]->backward_weight(ss.ctx, *ss.layers[i]);
        weights_done(a, i, index);
        if (frees) ss.layers[i].reset();  // done with this layer: its memory goes back now
      } else {
        between_layers();
      }
    }
    if (frees) stashes.erase({a.microbatch, a.stage});
    if (a.stage > 0)
      outputs.emplace(Key{static_cast<int>(Transfer::Gradient), a.microbatch, a.stage - 1}, std::move(dy));
    else if (vocab())
      embed_grad[a.microbatch] = std::move(dy);  // for every rank's embedding slice
  }

  void backward_weight(const Action& a, bool frees, size_t index) {
    fault::point("backward");
    ModelStage& st = stage(a);
    const double c0 = now();
    StageStash& ss = stash_of(a);
    auto& layers = st.layers();
    for (size_t i = layers.size(); i-- > 0;) {
      layers[i]->backward_weight(ss.ctx, *ss.layers[i]);
      weights_done(a, i, index);
      if (frees) ss.layers[i].reset();
    }
    if (frees) stashes.erase({a.microbatch, a.stage});
    compute_done(to_string(a), c0);
  }

  // An F, B or I as Steps; each takes its input at its first step.
  Steps<> compute(const Instr& in, size_t index) {
    if (in.action.op == Op::F) return forward(in.action, in.frees_stash);
    return backward_input(in.action, in.frees_stash, index);
  }

  // The time a computation waits, at a pause, for its exchange: the exposed part.
  void wait_paused(const Steps<>& t) {
    CommRequest* r = t.paused_on();
    if (!r) return;
    const double w0 = now();
    r->wait();
    stats.exchange_wait_s += now() - w0;
  }
  double waited() const { return stats.exchange_wait_s + stats.wait_s; }
  // One computation alone: each pause waits.
  void drive(Steps<> t, const std::string& name) {
    const double c0 = now(), w0 = waited();
    while (!t.done()) {
      wait_paused(t);
      t.step();
    }
    compute_done(name, c0, waited() - w0);
  }
  // The F&B pair at program[i] (validate_program: only the F's output stands between it and
  // the next compute, its partner): overlapped, or one after the other. Returns the
  // partner's index.
  size_t pair(const std::vector<Instr>& program, size_t i, bool overlap) {
    size_t j = i + 1;
    while (program.at(j).op != InstrOp::Compute) ++j;
    auto give_f_output = [&] {
      for (size_t k = i + 1; k < j; ++k) {
        current = k;
        if (program[k].op == InstrOp::Send) {
          ex.pp_.group_begin();
          send(program[k]);
          ex.pp_.group_end();
        } else {
          move(program[k]);
        }
      }
    };
    const Action &f = program[i].action, &b = program[j].action;
    const double w0 = stats.exchange_wait_s;
    if (overlap) {
      drive_pair(compute(program[i], i), compute(program[j], j), give_f_output, to_string(f) + "&" + to_string(b));
    } else {
      drive(compute(program[i], i), to_string(f));
      give_f_output();
      drive(compute(program[j], j), to_string(b));
    }
    stats.pair_exchange_wait_s += stats.exchange_wait_s - w0;
    return j;
  }

  // An F&B pair, overlapped: each runs until its next pause, then the other goes on — the
  // F starts — if it can (not started, or its exchange arrived); else whichever can first.
  // While one's all-to-all is in flight the other computes and tests it between products,
  // which moves it on; when neither can go on, the exposed wait tests both until one can.
  // Without tensor parallelism each computation's collectives are its own (forwards and
  // backwards exchange over their own communicators; only the backward reduces
  // gradients), so ranks may interleave differently. Under tp their collectives share the
  // tp group: the two then take turns in a fixed order, waiting where they must.
  void drive_pair(Steps<> f, Steps<> b, const std::function<void()>& give_f_output, const std::string& name) {
    const double c0 = now(), w0 = waited();
    const bool fixed_turns = ex.tp_ && ex.tp_->size() > 1;
    auto ready = [](Steps<>& t) { return !t.done() && (!t.paused_on() || t.paused_on()->test()); };
    auto other_than = [&](const Steps<>* t) { return t == &f ? &b : &f; };
    Steps<>* next = &f;
    while (!f.done() || !b.done()) {
      if (next->done()) next = other_than(next);
      if (fixed_turns) {
        wait_paused(*next);
      } else if (!ready(*next)) {  // the exposed wait: test both until one can go on
        const watchdog::Waiting waiting("the all-to-alls of " + name + "'s two computations");
        const double e0 = now();
        while (!ready(*next) && !ready(*other_than(next))) continue;
        stats.exchange_wait_s += now() - e0;
        if (!ready(*next)) next = other_than(next);
      }
      Steps<>& paused = *other_than(next);
      partner = paused.done() ? nullptr : paused.paused_on();
      next->step();
      if (next == &f && f.done()) give_f_output();
      next = &paused;  // the other's turn
    }
    partner = nullptr;
    compute_done(name, c0, waited() - w0);
  }

  // After the stage's last weight action of the step, each layer's gradient is final.
  void weights_done(const Action& a, size_t layer, size_t index) {
    if (hooks.layer_grads_final && last_weight_action[a.stage] == index)
      hooks.layer_grads_final(a.stage, static_cast<int>(layer));
    between_layers();  // keeps in-flight reductions moving
  }

  // A computation from c0 to now, less `waited` blocked on its exchanges.
  void compute_done(const std::string& name, double c0, double waited = 0) {
    const double c1 = now();
    stats.compute_s += c1 - c0 - waited;
    if (trace) stats.events.push_back({name, me, c0, c1 - c0});
  }
};

PipelineExecutor::PipelineExecutor(std::map<int, ModelStage*> stages, Communicator& pp, Communicator* tp,
                                   Backend& backend, MemoryPool& pool, int d_model, DType storage,
                                   std::map<int, Recompute> recompute)
    : stages_(std::move(stages)),
      pp_(pp),
      tp_(tp),
      backend_(backend),
      pool_(pool),
      d_model_(d_model),
      storage_(storage),
      recompute_(std::move(recompute)) {}

PipelineExecutor::~PipelineExecutor() { backend_.forget_packed_weights(); }

ExecutorStats PipelineExecutor::run(const std::vector<Instr>& program, const MicrobatchLoader& load, int B, int T,
                                    float loss_scale, bool trace, const ExecutorHooks& hooks) {
  const HeldWeights held(backend_);  // no weight changes during a program: the optimizer runs after it
  Impl st(*this, load, B, T, pp_.rank(), loss_scale, trace, hooks);
  for (size_t i = 0; i < program.size(); ++i) {
    const Instr& in = program[i];
    if (in.op == InstrOp::Compute && (in.action.op == Op::B || in.action.op == Op::W))
      st.last_weight_action[in.action.stage] = i;
  }
  st.load_step_data(program);
  // The transfers between two computes go out as one group (NCCL launches them together;
  // program.hpp: validate_in_order); MOVEs are local and leave a group open.
  bool grouped = false;
  auto close_group = [&] {
    if (grouped) pp_.group_end();
    grouped = false;
  };
  for (size_t i = 0; i < program.size(); ++i) {
    st.current = i;
    const Instr& in = program[i];
    if ((in.op == InstrOp::Recv || in.op == InstrOp::Send) && !grouped) {
      pp_.group_begin();
      grouped = true;
    }
    switch (in.op) {
      case InstrOp::Recv:
        st.post(in);
        continue;
      case InstrOp::Send:
        st.send(in);
        continue;
      case InstrOp::Move:
        st.move(in);
        continue;
      case InstrOp::Compute:
        close_group();
        break;
      case InstrOp::Vocab:
      case InstrOp::Coll:
        if (!vocab_.slice) fail("{}: a vocabulary-parallel instruction, but this rank holds no slice", to_string(in));
        close_group();
        if (in.op == InstrOp::Coll)
          st.post_collective(in);
        else
          st.vocab_piece(in);
        if (hooks.poll) hooks.poll();
        continue;
    }
    const Action& a = in.action;
    watchdog::set_position(
        fmt::format("step {}, instruction {} of {} ({})", hooks.step, i, program.size(), to_string(a)));
    if (in.overlaps_next) {
      i = st.pair(program, i, overlap_);
    } else if (a.op == Op::W) {
      st.backward_weight(a, in.frees_stash, i);
    } else {
      st.drive(st.compute(in, i), to_string(a));
    }
    if (hooks.poll) hooks.poll();
  }
  close_group();
  st.sum_losses();
  watchdog::set_position(fmt::format("step {}, end of the program (waiting for its sends)", hooks.step));
  const double w0 = st.now();
  for (auto& s : st.sends) s.request->wait();
  st.sends.clear();
  for (auto& c : st.contributed) c.request->wait();  // the sums this rank gave to and does not use
  st.contributed.clear();
  if (!st.colls.empty() || !st.output_stash.empty())
    fail("rank {}: the program left {} vocabulary collectives and {} output slices unused", st.me, st.colls.size(),
         st.output_stash.size());
  st.stats.wait_s += st.now() - w0;
  if (!st.stashes.empty() || !st.handoff.empty() || !st.recvs.empty() || !st.outputs.empty())
    fail("rank {}: the program left {} activation stashes, {} hand-offs, {} receives and {} outputs unused", st.me,
         st.stashes.size(), st.handoff.size(), st.recvs.size(), st.outputs.size());
  st.stats.total_s = st.now();
  return st.stats;
}

}  // namespace pipetrain
