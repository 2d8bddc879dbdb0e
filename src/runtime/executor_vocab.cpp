// PipelineExecutor::Impl's vocabulary-parallel pieces (executor_impl.hpp): the slices'
// computations and the collectives that join them.
#include "executor_impl.hpp"

namespace pipetrain {

MicrobatchContext PipelineExecutor::Impl::vocab_context(int m) {
  MicrobatchContext ctx = run_context();
  const int64_t n = static_cast<int64_t>(B) * T, at = slot.at(m) * n;
  ctx.tokens = tokens.view(at, {n});
  ctx.targets = targets.view(at, {n});
  set_positions(ctx, m);
  return ctx;
}

Tensor PipelineExecutor::Impl::take(std::map<int, Tensor>& from, int m, const Instr& in) {
  auto it = from.find(m);
  if (it == from.end()) fail("rank {}: {} has nothing to carry", me, to_string(in));
  Tensor t = std::move(it->second);
  from.erase(it);
  return t;
}

void PipelineExecutor::Impl::post_collective(const Instr& in) {
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

Tensor PipelineExecutor::Impl::collective_result(Coll which, int m, const std::string& who) {
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

void PipelineExecutor::Impl::vocab_piece(const Instr& in) {
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

}  // namespace pipetrain
