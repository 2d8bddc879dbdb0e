// PipelineExecutor::Impl (pipetrain/runtime/executor.hpp), private to the executor's files:
// one step's state and the instructions' work. executor.cpp moves data (the step's tokens,
// receives, sends, hand-offs, contexts) and runs the program; executor_compute.cpp runs a
// stage's F, B, I and W; executor_pairs.cpp drives an overlapped pair's two computations;
// executor_vocab.cpp runs the vocabulary slices' pieces and collectives.
#pragma once
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
#include "pipetrain/runtime/executor.hpp"
#include "pipetrain/schedule/stage_transfer.hpp"

namespace pipetrain {

namespace executor_detail {

using Clock = std::chrono::steady_clock;

struct Key {
  int kind, microbatch, stage;  // Transfer kind; stage = the consumer
  auto operator<=>(const Key&) const = default;
};
inline Key key_of(const Instr& i) { return {static_cast<int>(i.kind), i.microbatch, i.stage}; }
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

}  // namespace executor_detail

// The Impl's files are the executor's own: its helper types without the prefix.
using namespace executor_detail;

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
  // The SHARD instructions inside the running compute (at its layers, in order; none in an
  // overlapped pair), and the next to run. unit_work before a layer's work runs its gathers
  // and readies its units; unit_done after it runs its frees and reduce-scatters.
  std::vector<const Instr*> inside;
  size_t inside_next = 0;
  void unit_work(const Action& a, int layer);
  void unit_done(int layer);
  void shard(const Instr& in);  // through hooks.shard
  // The compute at i takes the instructions inside it; after it, they must all have run.
  void take_inside(const std::vector<Instr>& program, size_t i);
  void inside_done(const Action& a);
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
  // Packed documents: every microbatch this rank computes (place[m] in `positions`); under
  // context parallelism each token's document's first global position too (`starts`).
  std::map<int, int64_t> place;
  Tensor positions, starts;
  int64_t losses_kept = 0;
  // Vocabulary parallelism: each microbatch's slice results until their collective takes
  // them (EF's partial lookup, the last stage's hidden states, OF's softmax partials of their
  // gradient, the first stage's input gradient), the posted collectives, OF's stashes.
  std::map<int, Tensor> partial_lookup, hidden, hidden_grad, embed_grad;
  std::map<std::pair<int, int>, PendingColl> colls;  // (Coll, microbatch), waited for here
  std::deque<PendingColl> contributed;               // given only (unused sums, a root's sends): freed once done
  std::map<int, VocabOutputStash> output_stash;
  // In an overlapped pair: the other computation's exchange in flight, tested between this
  // one's products (test_partner). Under free turns the other itself (partner_steps): paused
  // briefly (its counts) and they are in, it goes on there to its next pause, posting the
  // exchange they size while this one computes, not after (partner_steps_taken: how often).
  CommRequest* partner = nullptr;
  Steps<>* partner_steps = nullptr;
  size_t partner_steps_taken = 0;
  bool in_partner_step = false;
  void test_partner();
  // In a program of overlapped pairs whose halves interleave freely (free_turns()), every
  // B's weight gradients, layer by layer (the head's excepted), wait here, and a B's stash
  // is freed behind them: any exposed exchange wait runs them, oldest first. A B ends with
  // at most its own left (the older run first: one microbatch's stash held beyond its B),
  // which the next computations' waits can run; an explicit W and the program's end run
  // them all. Each parameter's gradient takes the same terms in the same order as without,
  // and the dp buckets go out in the same order, later.
  bool defer_weights = false;
  std::deque<std::function<void()>> weight_work;
  void run_weight_work();  // the oldest
  // In an exposed wait begun at `since`: the oldest, if any, the wait so far counted and
  // `since` restarted after it.
  void fill_wait(double& since);
  void run_all_weight_work() {  // outside any computation: timed as one
    if (weight_work.empty()) return;
    const double c0 = now();
    while (!weight_work.empty()) run_weight_work();
    compute_done("W (deferred)", c0);
  }
  // tp ranks must post their collectives alike, and so must ep ranks exchanging over NCCL:
  // otherwise a pair's halves may interleave freely.
  bool free_turns() const { return ex.pairs_.free_turns; }
  bool vocab() const { return ex.vocab_.slice != nullptr; }

  void load_step_data(const std::vector<Instr>& program);
  void set_positions(MicrobatchContext& ctx, int m) const;  // packed documents
  void load_positions(const std::vector<Instr>& program, std::vector<int32_t>& host_in, std::vector<int32_t>& host_tgt);
  // Packed documents under context parallelism: `starts` from the documents' positions.
  void load_document_starts(const std::vector<int32_t>& host);
  // The head's losses of this run, summed in the order they were computed.
  void sum_losses();

  double now() const { return std::chrono::duration<double>(Clock::now() - t0).count(); }

  // Megatron's scatter-gather: every tensor that crosses stages is replicated over the
  // stage's tp ranks, so each tp rank moves only its 1/tp slice between stages and the
  // receiving tp ranks all-gather the whole (bytes per rank divided by tp, values unchanged).
  // Under sequence parallelism a stage's input and output already are this rank's rows: sent
  // and received as they are, nothing gathered.
  StageTransfer transfer() const { return stage_transfer(ex.tp_ ? ex.tp_->size() : 1, ex.sequence_parallel_); }
  bool scatter(const Tensor& t) const {
    return transfer() == StageTransfer::SliceThenGather && t.numel() % ex.tp_->size() == 0;
  }
  bool rows_between_stages() const { return transfer() == StageTransfer::Rows; }
  Tensor my_slice(const Tensor& t) const;

  // RECV: posted now into a pooled buffer, waited on by the compute that needs it.
  void post(const Instr& in);

  // SEND: the output goes out as soon as it exists; completed sends free their buffers.
  void send(const Instr& in);

  // MOVE: a hand-off to a stage of this rank.
  void move(const Instr& in) { handoff.emplace(key_of(in), take_output(in)); }

  Tensor take_output(const Instr& in);

  // The input of action `a`: handed over on this rank, or a posted receive waited on now.
  Tensor take_input(const Action& a, Key key);

  ModelStage& stage(const Action& a);

  // What every computation of this run shares: backend, pool, shapes, loss scale, storage.
  MicrobatchContext run_context() const;

  MicrobatchContext make_context(int m, int stage, const ModelStage& st);

  // ---- vocabulary parallelism ----
  MicrobatchContext vocab_context(int m);
  Tensor take(std::map<int, Tensor>& from, int m, const Instr& in);
  // COLL: posts the collective on this rank's data (or into a buffer for its result).
  void post_collective(const Instr& in);
  // Between two layers: the dp reducer's poll, and one test of a vocabulary collective in
  // flight. Any test advances every pending request of the process (Open MPI's progress
  // engine), so a collective another rank waits for moves on during this rank's products.
  // (A progress thread woken every millisecond did the same at 10-15% of the step where
  // ranks have no core to spare: bench/RESULTS.md.) In an overlapped pair, the paused
  // partner's all-to-all is tested too (test_partner).
  void between_layers();
  // The result of a posted collective, waited for now.
  Tensor collective_result(Coll which, int m, const std::string& who);
  // VOCAB: this rank's slice of microbatch m.
  void vocab_piece(const Instr& in);

  // F's input, waited for now (a receive, a hand-off, or under vocabulary parallelism the
  // slices' lookups), and its stash's context.
  Tensor forward_input(const Action& a);

  // `ep`: the communicator its all-to-alls go over (ExpertParallel's forward one, or the
  // backward one for an F&F pair's second: two computations in flight never share one).
  Steps<> forward(Action a, bool frees, Communicator* ep);

  StageStash& stash_of(const Action& a);

  // B or I's output gradient, waited for now: a receive, a hand-off, or under vocabulary
  // parallelism every slice's softmax partials, merged.
  Tensor backward_input_gradient(const Action& a);

  // B or I; `index`: its place in the program.
  Steps<> backward_input(Action a, bool frees, size_t index);

  void backward_weight(const Action& a, bool frees, size_t index);

  // An F, B or I as Steps; each takes its input at its first step. `beside_forward`: the
  // second of an F&F pair.
  Steps<> compute(const Instr& in, size_t index, bool beside_forward = false);

  // The time a computation waits, at a pause, for its exchange: the exposed part (filled by
  // deferred weight gradients while any are left).
  void wait_paused(const Steps<>& t);
  double waited() const { return stats.exchange_wait_s + stats.wait_s; }
  // One computation alone: each pause waits.
  void drive(Steps<> t, const std::string& name);
  // The overlapped pair at program[i] (validate_program: only the F's output stands between
  // it and the next compute, its partner): overlapped, or one after the other. Returns the
  // partner's index.
  size_t pair(const std::vector<Instr>& program, size_t i, bool overlap);

  // A pair, overlapped: each runs until its next pause, then the one PairTurns names goes on
  // (pair_turns.hpp: the F starts; the other's turn after each step, or the F's in an F&F
  // pair; the second starts once its input is here). While one's all-to-all is in flight
  // the other computes and tests it between products, which moves it on (and, paused
  // briefly, lets it post its next exchange: test_partner); when neither can go on, the
  // exposed wait tests both until one can.
  // Without tensor parallelism each computation's collectives are its own (the two exchange
  // over their own communicators; only a backward reduces gradients), so ranks may
  // interleave differently. Under tp their collectives share the tp group: the two then
  // take turns in a fixed order, waiting where they must.
  struct PairRun {
    std::string name;
    std::function<void()> give_f_output;
    std::function<bool()> second_input_here;
    bool f_leads = false;    // an F&F pair
    bool one_stage = false;  // the two of one stage
  };
  void drive_pair(Steps<> f, Steps<> b, const PairRun& run);
  // Whether computation a's input from another computation (a receive or a hand-off) is
  // here, or it needs none.
  bool input_here(const Action& a);

  // After the stage's last weight action of the step, each layer's gradient is final.
  void weights_done(const Action& a, size_t layer, size_t index);

  // A computation from c0 to now, less `waited` blocked on its exchanges.
  void compute_done(const std::string& name, double c0, double waited = 0);
};

}  // namespace pipetrain
