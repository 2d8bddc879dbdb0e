// PipelineExecutor (pipetrain/runtime/executor.hpp): the step's data, receives, sends and
// hand-offs, the microbatch contexts, and running one rank's program.
#include "executor_impl.hpp"
#include "pipetrain/model/ring_attention.hpp"

namespace pipetrain {

void PipelineExecutor::Impl::load_step_data(const std::vector<Instr>& program) {
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
  std::vector<int32_t> host_in(slot.size() * static_cast<size_t>(n)), host_tgt(host_in.size());
  if (ex.packed_ || ex.cp_) {
    load_positions(program, host_in, host_tgt);
  } else {
    for (const auto& [m, at] : slot) load(m, host_in.data() + at * n, host_tgt.data() + at * n, nullptr);
  }
  if (!slot.empty()) {
    const int64_t k = static_cast<int64_t>(slot.size());
    tokens = Tensor::empty(ex.pool_, {k * n}, DType::I32);
    targets = Tensor::empty(ex.pool_, {k * n}, DType::I32);
    ex.backend_.to_device(tokens.raw(), host_in.data(), tokens.bytes());
    ex.backend_.to_device(targets.raw(), host_tgt.data(), targets.bytes());
  }
  if (heads > 0) losses = Tensor::empty(ex.pool_, {heads * n});
}

// Every microbatch this rank computes gets its positions, loaded together with its tokens
// and targets where it needs those too; checked to be document positions (each run counts
// up from 0 at a document's start), so no kernel reads outside a sequence.
void PipelineExecutor::Impl::load_positions(const std::vector<Instr>& program, std::vector<int32_t>& host_in,
                                            std::vector<int32_t>& host_tgt) {
  const int64_t n = static_cast<int64_t>(B) * T;
  for (const Instr& in : program) {
    const bool vocab_forward = in.op == InstrOp::Vocab && in.vocab == VocabOp::OutputForward;
    if (vocab_forward || (in.op == InstrOp::Compute && in.action.op == Op::F))
      place.emplace(vocab_forward ? in.microbatch : in.action.microbatch, static_cast<int64_t>(place.size()));
  }
  std::vector<int32_t> host(place.size() * static_cast<size_t>(n));
  for (const auto& [m, at] : place) {
    const auto it = slot.find(m);
    int32_t* p = host.data() + at * n;
    if (it == slot.end())
      load(m, nullptr, nullptr, p);
    else
      load(m, host_in.data() + it->second * n, host_tgt.data() + it->second * n, p);
    // Under context parallelism a rank's rows are chunks: a document may begin before them.
    for (int64_t r = 0; r < n && ex.packed_ && !ex.cp_; ++r)
      if (p[r] != 0 && (r % T == 0 || p[r] != p[r - 1] + 1))
        fail(
            "microbatch {}: token {} of sequence {} is at position {}, which does not count up from its document's "
            "start (packed documents)",
            m, r % T, r / T, p[r]);
  }
  if (place.empty()) return;
  positions = Tensor::empty(ex.pool_, {static_cast<int64_t>(host.size())}, DType::I32);
  ex.backend_.to_device(positions.raw(), host.data(), positions.bytes());
  if (ex.packed_ && ex.cp_) load_document_starts(host);
}

// A token at global position g and document position p: its document starts at g - p,
// which must lie in the sequence, and each chunk's positions count up within a document.
void PipelineExecutor::Impl::load_document_starts(const std::vector<int32_t>& host) {
  const std::vector<int32_t> global = ring_positions(ex.cp_tokens_, ex.cp_->size(), ex.cp_->rank());
  std::vector<int32_t> first(host.size());
  for (size_t r = 0; r < host.size(); ++r) {
    const size_t t = r % static_cast<size_t>(T);
    const bool follows = t > 0 && global[t] == global[t - 1] + 1;
    if (host[r] < 0 || host[r] > global[t] || (follows && host[r] != 0 && host[r] != host[r - 1] + 1))
      fail(
          "token {} of a sequence (global position {}) is at document position {}, which does not count up from its "
          "document's start (packed documents, context parallelism)",
          t, global[t], host[r]);
    first[r] = global[t] - host[r];
  }
  starts = Tensor::empty(ex.pool_, {static_cast<int64_t>(first.size())}, DType::I32);
  ex.backend_.to_device(starts.raw(), first.data(), starts.bytes());
}

void PipelineExecutor::Impl::sum_losses() {
  if (losses_kept == 0) return;
  std::vector<float> host(static_cast<size_t>(losses_kept * B * T));
  ex.backend_.to_host(host.data(), losses.raw(), host.size() * sizeof(float));
  for (float l : host) stats.loss_sum += l;
}

Tensor PipelineExecutor::Impl::my_slice(const Tensor& t) const {
  const int64_t chunk = t.numel() / ex.tp_->size();
  return t.view(chunk * ex.tp_->rank(), {chunk});
}

void PipelineExecutor::Impl::post(const Instr& in) {
  PendingRecv r;
  const int64_t rows = static_cast<int64_t>(B) * T / (rows_between_stages() ? ex.tp_->size() : 1);
  r.buffer = Tensor::empty(ex.pool_, {rows, ex.d_model_}, ex.storage_);
  r.peer = in.peer;
  r.request = ex.pp_.recv(scatter(r.buffer) ? my_slice(r.buffer) : r.buffer, in.peer, in.tag, ex.backend_.stream());
  recvs.emplace(key_of(in), std::move(r));
}

void PipelineExecutor::Impl::send(const Instr& in) {
  Tensor t = take_output(in);
  PendingSend s;
  const Tensor part = scatter(t) ? my_slice(t) : t;
  stats.bytes_sent += static_cast<double>(part.bytes());
  s.request = ex.pp_.send(part, in.peer, in.tag, ex.backend_.stream());
  s.buffer = std::move(t);
  sends.push_back(std::move(s));
  while (!sends.empty() && sends.front().request->test()) sends.pop_front();
}

Tensor PipelineExecutor::Impl::take_output(const Instr& in) {
  auto it = outputs.find(key_of(in));
  if (it == outputs.end())
    fail("rank {}: instruction {} of the program ({}) has nothing to send", me, current, to_string(in));
  Tensor t = std::move(it->second);
  outputs.erase(it);
  return t;
}

Tensor PipelineExecutor::Impl::take_input(const Action& a, Key key) {
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

ModelStage& PipelineExecutor::Impl::stage(const Action& a) {
  auto it = ex.stages_.find(a.stage);
  if (it == ex.stages_.end())
    fail("rank {}: action {} is for stage {}, which this rank does not hold", me, to_string(a), a.stage);
  return *it->second;
}

MicrobatchContext PipelineExecutor::Impl::run_context() const {
  MicrobatchContext ctx;
  ctx.backend = &ex.backend_;
  ctx.pool = &ex.pool_;
  ctx.B = B;
  ctx.T = T;
  ctx.loss_scale = loss_scale;
  ctx.storage = ex.storage_;
  ctx.moe = hooks.moe;
  ctx.sequence_parallel = ex.sequence_parallel_;
  ctx.cp = ex.cp_;
  ctx.cp_tokens = ex.cp_tokens_;
  return ctx;
}

void PipelineExecutor::Impl::set_positions(MicrobatchContext& ctx, int m) const {
  if (!ex.packed_ && !ex.cp_) return;
  const int64_t n = static_cast<int64_t>(B) * T;
  ctx.positions = positions.view(place.at(m) * n, {n});
  if (starts.defined()) ctx.document_starts = starts.view(place.at(m) * n, {n});
}

MicrobatchContext PipelineExecutor::Impl::make_context(int m, int stage, const ModelStage& st) {
  MicrobatchContext ctx = run_context();
  ctx.tp = ex.tp_;
  ctx.ep = ex.ep_;
  ctx.progress = [this] { test_partner(); };
  if (auto it = ex.recompute_.find(stage); it != ex.recompute_.end()) ctx.recompute = it->second;
  set_positions(ctx, m);
  if (!vocab() && (st.has_embedding() || st.has_head())) {
    const int64_t n = static_cast<int64_t>(B) * T, at = slot.at(m) * n;
    if (st.has_embedding()) ctx.tokens = tokens.view(at, {n});
    if (st.has_head()) ctx.targets = targets.view(at, {n});
  }
  return ctx;
}

void PipelineExecutor::Impl::between_layers() {
  if (hooks.poll) hooks.poll();
  test_partner();
  if (!vocab()) return;
  for (auto& [key, c] : colls)
    if (c.request) {
      c.request->test();
      return;
    }
  if (!contributed.empty()) contributed.front().request->test();
}

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
  // Weight gradients wait for exposed exchange waits where overlapped pairs interleave freely.
  // (A deferred one posts dp buckets: never where ranks must post collectives alike.)
  st.defer_weights = pairs_.defer_weights &&
                     std::any_of(program.begin(), program.end(), [](const Instr& in) { return in.overlaps_next; });
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
      case InstrOp::Shard:  // (inside ones run in their compute)
        close_group();
        if (in.at_layer < 0) st.shard(in);
        continue;
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
    st.take_inside(program, i);
    if (in.overlaps_next) {
      i = st.pair(program, i, pairs_.overlap);
    } else if (a.op == Op::W) {
      st.run_all_weight_work();  // each gradient's terms in program order
      st.backward_weight(a, in.frees_stash, i);
    } else {
      st.drive(st.compute(in, i), to_string(a));
    }
    st.inside_done(a);
    if (hooks.poll) hooks.poll();
  }
  close_group();
  st.run_all_weight_work();  // a program that ends in a B
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
