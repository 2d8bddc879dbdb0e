// PipelineExecutor::Impl's F&B pairs (executor_impl.hpp): driving one computation or two
// overlapped, each paused where its all-to-all is in flight.
#include "executor_impl.hpp"
#include "pipetrain/comm/progress_thread.hpp"

namespace pipetrain {

void PipelineExecutor::Impl::wait_paused(const Steps<>& t) {
  CommRequest* r = t.paused_on();
  if (!r) return;
  double w0 = now();
  while (!weight_work.empty() && !r->test()) fill_wait(w0);
  r->wait();
  stats.exchange_wait_s += now() - w0;
}

void PipelineExecutor::Impl::fill_wait(double& since) {
  if (weight_work.empty()) return;
  stats.exchange_wait_s += now() - since;
  run_weight_work();
  since = now();
}

void PipelineExecutor::Impl::drive(Steps<> t, const std::string& name) {
  const double c0 = now(), w0 = waited();
  while (!t.done()) {
    wait_paused(t);
    t.step();
  }
  compute_done(name, c0, waited() - w0);
}

size_t PipelineExecutor::Impl::pair(const std::vector<Instr>& program, size_t i, bool overlap) {
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

void PipelineExecutor::Impl::drive_pair(Steps<> f, Steps<> b, const std::function<void()>& give_f_output,
                                        const std::string& name) {
  const double c0 = now(), w0 = waited();
  const bool fixed_turns = !free_turns();
  auto ready = [](Steps<>& t) { return !t.done() && (!t.paused_on() || t.paused_on()->test()); };
  auto other_than = [&](const Steps<>* t) { return t == &f ? &b : &f; };
  Steps<>* next = &f;
  struct Progress {  // the exchanges move during the products too
    ProgressThread* thread;
    ~Progress() {
      if (thread) thread->release();
    }
  } progress{fixed_turns ? nullptr : ex.progress_};
  if (progress.thread) progress.thread->hold();
  while (!f.done() || !b.done()) {
    if (next->done()) next = other_than(next);
    if (fixed_turns) {
      wait_paused(*next);
    } else if (!ready(*next)) {  // the exposed wait: deferred weight gradients, else test both until one can go on
      const watchdog::Waiting waiting("the all-to-alls of " + name + "'s two computations");
      double e0 = now();
      while (!ready(*next) && !ready(*other_than(next))) fill_wait(e0);
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

}  // namespace pipetrain
