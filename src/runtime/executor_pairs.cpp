// PipelineExecutor::Impl's overlapped pairs (executor_impl.hpp): driving one computation or
// two overlapped, each paused where its all-to-all is in flight.
#include "executor_impl.hpp"
#include "pipetrain/comm/progress_thread.hpp"
#include "pipetrain/runtime/pair_turns.hpp"

namespace pipetrain {

void PipelineExecutor::Impl::wait_paused(const Steps<>& t) {
  CommRequest* r = t.paused_on();
  if (!r) return;
  double w0 = now();
  while (!weight_work.empty() && !r->test()) fill_wait(w0);
  r->wait();
  stats.exchange_wait_s += now() - w0;
}

void PipelineExecutor::Impl::test_partner() {
  if (in_partner_step || !partner || !partner->test()) return;
  if (!partner_steps || !partner_steps->paused_briefly()) return;
  // Its counts are in: it posts the exchange they size now, from between this one's products.
  // (It then pauses again: a brief pause is never a computation's last, moe_exchange.cpp.)
  struct Inside {  // its own progress points test nothing: the request it waited on goes
    Impl& st;
    explicit Inside(Impl& s) : st(s) { st.in_partner_step = true, st.partner = nullptr; }
    ~Inside() { st.in_partner_step = false; }
  } inside(*this);
  partner_steps->step();
  ++partner_steps_taken;
  partner = partner_steps->done() ? nullptr : partner_steps->paused_on();
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
  const bool two_forwards = b.op == Op::F;
  const double w0 = stats.exchange_wait_s;
  // Under fixed turns an F&F pair would alternate, holding back the F's output (the next
  // stage's input): its two run one after the other.
  if (overlap && !(two_forwards && !free_turns())) {
    drive_pair(compute(program[i], i), compute(program[j], j, two_forwards),
               {to_string(f) + "&" + to_string(b), give_f_output, [this, b] { return input_here(b); }, two_forwards,
                f.stage == b.stage});
  } else {
    drive(compute(program[i], i), to_string(f));
    give_f_output();
    drive(compute(program[j], j, two_forwards), to_string(b));
  }
  stats.pair_exchange_wait_s += stats.exchange_wait_s - w0;
  return j;
}

bool PipelineExecutor::Impl::input_here(const Action& a) {
  const bool forward = a.op == Op::F;
  if (forward ? a.stage == 0 : stage(a).has_head()) return true;
  const Key key{forward ? kActivation : static_cast<int>(Transfer::Gradient), a.microbatch, a.stage};
  if (handoff.count(key)) return true;
  auto it = recvs.find(key);
  return it == recvs.end() || it->second.request->test();  // none: take_input names the fault
}

void PipelineExecutor::Impl::drive_pair(Steps<> f, Steps<> b, const PairRun& run) {
  const double c0 = now(), w0 = waited();
  const bool fixed_turns = !free_turns();
  PairTurns turns({run.f_leads, run.f_leads && run.one_stage, fixed_turns});
  PairSide sides[2];
  Steps<>* steps[2] = {&f, &b};
  auto next = [&] {  // tests both exchanges in flight, which moves them on
    for (int k = 0; k < 2; ++k) {
      const Steps<>& t = *steps[k];
      sides[k].done = t.done();
      sides[k].in_flight = !t.done() && t.paused_on() && !t.paused_on()->test();
    }
    return turns.next(sides[0], sides[1], sides[1].steps > 0 || sides[0].done || run.second_input_here());
  };
  struct Progress {  // the exchanges move during the products too; nothing points into the pair after it
    Impl& st;
    ProgressThread* thread;
    ~Progress() {
      if (thread) thread->release();
      st.partner = nullptr;
      st.partner_steps = nullptr;
    }
  } progress{*this, fixed_turns ? nullptr : ex.progress_};
  if (progress.thread) progress.thread->hold();
  bool f_given = false;
  while (!f.done() || !b.done()) {
    PairTurns::Who who = next();
    if (who == PairTurns::Neither) {  // the exposed wait: deferred weight gradients, else test both until one can go on
      const watchdog::Waiting waiting("the all-to-alls of " + run.name + "'s two computations");
      double e0 = now();
      while ((who = next()) == PairTurns::Neither) fill_wait(e0);
      stats.exchange_wait_s += now() - e0;
    }
    Steps<>& t = *steps[who];
    if (fixed_turns) wait_paused(t);
    Steps<>& other = *steps[1 - who];
    partner = other.done() ? nullptr : other.paused_on();
    partner_steps = fixed_turns ? nullptr : &other;  // paused briefly, it may go on from between t's products
    t.step();
    partner_steps = nullptr;  // the driver's own waits step neither
    sides[who].steps += 1;
    sides[1 - who].steps += std::exchange(partner_steps_taken, 0);
    turns.stepped(who);
    if (f.done() && !f_given) {
      run.give_f_output();
      f_given = true;
    }
  }
  compute_done(run.name, c0, waited() - w0);
}

}  // namespace pipetrain
