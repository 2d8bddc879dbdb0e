// PipelineExecutor: interprets one rank's lowered program (pipetrain/schedule/program.hpp)
// for one step, and decides nothing itself: RECV posts a receive into a pooled buffer,
// a compute (F / B / I / W) waits for its input (a posted receive, or a hand-off from a
// stage of this rank), runs the stage's layers and keeps its output, SEND sends it with
// a nonblocking send, MOVE hands it to a stage of this rank; a compute marked so frees
// its stashed activations. Peers and tags come from the program. An overlapped pair (a
// compute marked overlaps_next and the next compute: F&B, or F&F) runs overlapped: each
// computation is Steps (comm/steps.hpp) that pause where a layer's all-to-all is in flight,
// and the executor runs whichever can go on (pair_turns.hpp) so one microbatch's exchange
// travels while the other computes. The two exchange over communicators of their own, so
// the order in which a rank interleaves them never has to match another rank's.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "pipetrain/comm/communicator.hpp"
#include "pipetrain/model/stage.hpp"
#include "pipetrain/schedule/pair_rule.hpp"
#include "pipetrain/schedule/program.hpp"
#include "pipetrain/schedule/schedule.hpp"

namespace pipetrain {

class Backend;
class ProgressThread;
class VocabSlice;

// Vocabulary parallelism (schedule/vocab_pieces.hpp): this rank's slice and the group the
// slices' collectives run over (the pipeline × tensor-parallel ranks of a replica), with
// the group ranks of the first and last stages' roots.
struct VocabRun {
  VocabSlice* slice = nullptr;
  Communicator* group = nullptr;
  int first_root = 0, last_root = 0;
  bool holds_first = false, holds_last = false;  // this rank runs stage 0 / the last stage
  // Whether sums reach every rank of the group (an all-reduce: the first or last stage has
  // several tensor-parallel ranks) or only the root (a reduce).
  bool sums_to_all = false;
};

// Fills the host token, target and position arrays (B*T each) of microbatch m; any
// pointer may be null (positions are asked for only when documents are packed).
using MicrobatchLoader = std::function<void(int m, int32_t* inputs, int32_t* targets, int32_t* positions)>;

struct TraceEvent {
  std::string name;  // "1F3" for compute, "wait 1F3" for time blocked on its input
  int rank = 0;
  double start_s = 0, dur_s = 0;
  int step = -1;  // the training step it belongs to (set by the caller)
};

struct ExecutorStats {
  double compute_s = 0;  // inside layer kernels
  double wait_s = 0;     // blocked on receives and, at the end, on sends
  double total_s = 0;
  int peak_stashed = 0;  // most (microbatch, stage) activation stashes alive at once
  double loss_sum = 0;   // sum of token losses computed here (last stage only)
  double bytes_sent = 0; // pipeline bytes this rank sent (its 1/tp slice of each tensor under tp)
  int copies_refreshed = 0;  // runtime.pack_weights: packed copies refreshed while a receive was due
  double refresh_s = 0;      // the time that took (in compute_s, not in wait_s)
  // Blocked on mixture-of-experts all-to-alls (the part no computation hid; in neither
  // compute_s nor wait_s), and the part of it inside overlapped pairs (overlapped or not).
  double exchange_wait_s = 0, pair_exchange_wait_s = 0;
  std::vector<TraceEvent> events;
};

// Callbacks into the trainer while a step runs.
struct ExecutorHooks {
  // Layer `layer` of stage `stage` has accumulated its last weight gradient of the step
  // (its data-parallel reduction may start).
  std::function<void(int stage, int layer)> layer_grads_final;
  // Called after every action (lets nonblocking collectives progress).
  std::function<void()> poll;
  int step = -1;  // for the hang watchdog's report
  MoeStepStats* moe = nullptr;
  // Sharded data parallelism (schedule/shard_pass.hpp): a SHARD instruction to run now —
  // between computes where the program has it, inside one at its layer — and, before each
  // layer's work, its units made ready: the weights it reads, the gradient it writes.
  std::function<void(const Instr&)> shard;
  std::function<void(int stage, int layer, bool reads, bool writes)>
      layer_units;  // the step's routing, from every mixture-of-experts layer
};

class PipelineExecutor {
 public:
  // stages: the ModelStage of every global stage this rank owns. pp: the pipeline
  // communicator, whose rank numbers are the program's ranks. tp: the stage's
  // tensor-parallel peers (may be null). storage: the dtype activations and their
  // gradients are stored and sent in (train.precision). recompute: each stage's mode
  // (train.recompute; stages not listed recompute nothing).
  PipelineExecutor(std::map<int, ModelStage*> stages, Communicator& pp, Communicator* tp, Backend& backend,
                   MemoryPool& pool, int d_model, DType storage = DType::F32,
                   std::map<int, Recompute> recompute = {});

  // Runs `program` (this rank's instructions of a validated Program) over microbatches
  // of B sequences of T tokens. loss_scale = d(step loss)/d(token loss); 0 for a
  // forward-only program (evaluation).
  ExecutorStats run(const std::vector<Instr>& program, const MicrobatchLoader& load, int B, int T,
                    float loss_scale, bool trace, const ExecutorHooks& hooks = {});
  // Vocabulary parallelism: the slice and group the program's VOCAB and COLL use.
  void set_vocab(const VocabRun& vocab) { vocab_ = vocab; }
  // Expert parallelism: the stage's ep ranks, whom mixture-of-experts layers exchange rows
  // with: forwards over `forward`, backwards over `backward` (the same ranks).
  void set_experts(Communicator* forward, Communicator* backward) {
    ep_ = forward;
    ep_backward_ = backward;
  }
  // How overlapped pairs run (schedule/pair_rule.hpp): overlapped or one after the
  // other, their halves' turns (fixed: an F&F pair runs in order), the weight gradients' deferral.
  void set_pair_rule(const PairRule& rule) { pairs_ = rule; }
  // MPI's progress thread (comm/progress_thread.hpp), held through each overlapped pair whose
  // halves interleave freely: a transport that moves data only inside MPI calls (TCP) then
  // moves an exchange during the other half's products, not only between them.
  void set_progress(ProgressThread* progress) { progress_ = progress; }
  // Packed documents (core/documents.hpp): every stage loads each microbatch's positions.
  void set_packed_documents(bool packed) { packed_ = packed; }
  // Sequence parallelism (model/sequence_parallel.hpp): stages hand each other this tp
  // rank's rows, and layers convert between rows and whole where they differ.
  void set_sequence_parallel(bool on) { sequence_parallel_ = on; }
  // Context parallelism (model/ring_attention.hpp): each rank runs its chunks of every
  // sequence of `tokens` (run()'s T is its share), every stage loads their global positions,
  // and attention runs as a ring over `cp`.
  void set_context_parallel(Communicator* cp, int tokens) {
    cp_ = cp;
    cp_tokens_ = tokens;
  }
  // The backend forgets its packed copies of the stages' weights, which go away with them.
  ~PipelineExecutor();
  PipelineExecutor(const PipelineExecutor&) = delete;
  PipelineExecutor& operator=(const PipelineExecutor&) = delete;

 private:
  struct Impl;
  std::map<int, ModelStage*> stages_;
  Communicator& pp_;
  Communicator* tp_;
  Communicator *ep_ = nullptr, *ep_backward_ = nullptr;
  ProgressThread* progress_ = nullptr;
  Backend& backend_;
  MemoryPool& pool_;
  int d_model_;
  DType storage_;
  std::map<int, Recompute> recompute_;
  VocabRun vocab_;
  PairRule pairs_;
  bool packed_ = false;
  bool sequence_parallel_ = false;
  Communicator* cp_ = nullptr;
  int cp_tokens_ = 0;
};

}  // namespace pipetrain
