// The lowered program: what each pipeline rank executes, transfers included.
//
// `lower` turns a compute-only Schedule into a Program — the one place where the
// dependency rule becomes communication: every F output that feeds a stage on another
// rank becomes a SEND on the producer and a RECV (posted ahead, waited at first use) on
// the consumer, the same for input gradients going back, and a hand-off between stages
// of the same rank (V placement) is an explicit MOVE. Tags come from a TagPlan checked
// against MPI_TAG_UB. The executor interprets a validated Program and decides nothing.
//
// Instruction names follow PyTorch's compute_comms CSV: "1F0", "0SEND_F1" (stage 0
// sends the activation of microbatch 1), "1RECV_F1" (stage 1 receives it), "1SEND_B0"
// (stage 1 sends its input gradient of microbatch 0), "0RECV_B0".
//
// Vocabulary parallelism (vocab_pieces.hpp) adds two kinds: VOCAB, a rank's slice of the
// input embedding or of the output layer for one microbatch ("EF0" embedding forward,
// "OF0" output forward, "OB0" output backward, "EB0" embedding backward), and COLL, the
// post of a nonblocking collective over the pipeline group ("REDUCE_E0", "BCAST_X0",
// "ALLGATHER_S0", "REDUCE_DX0", "BCAST_DE0"), which every rank posts in the same order.
//
// Sharded data parallelism (shard_pass.hpp) adds SHARD, a collective over the data-parallel
// ranks of one unit's weights or gradients: "GATHER_W0.3" (all-gather stage 0's unit 3),
// "FREE_W0.3" (drop the gathered copy), "REDUCE_SCATTER_G0.3" (sum its gradient, each rank
// keeping its shard); "@k" when it runs inside the compute before it, at that compute's layer k.
// Exports: InstrOp, VocabOp, Coll, ShardOp, Instr, Program, LowerOptions, lower, forward_only_schedule,
// validate_program, validate_in_order, post_for_in_order, program_position, walk_program, value_key,
// collective_input, to_string(Instr). Files: lower.cpp, validate_program.cpp, validate_in_order.cpp,
// walk_program.cpp, validate_vocab.cpp.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "pipetrain/schedule/schedule.hpp"
#include "pipetrain/schedule/tag_plan.hpp"

namespace pipetrain {

enum class InstrOp { Compute, Send, Recv, Move, Vocab, Coll, Shard };

// A rank's vocabulary slice for one microbatch: the partial input embedding of its rows
// (EF), the logits of its columns with their local softmax statistics and its softmax
// partials of the hidden states' gradient (OF), the loss and its weight gradient once every
// slice's statistics are known (OB), and its rows' gradient from the embedding output's
// gradient (EB).
enum class VocabOp { EmbedForward, OutputForward, OutputBackward, EmbedBackward };

// The collectives over the pipeline group, one of each per microbatch, with what a rank
// contributes when it posts one and who waits for it:
//   EmbedSum      REDUCE_E   EF's partial embedding; summed for the first stage's F
//   Hidden        BCAST_X    the last stage's final hidden states (root: the last stage's
//                            rank, posted before its OF; sent to each rank); every rank's OF
//   Stats         ALLGATHER_S  OF's softmax statistics; every rank's OB
//   HiddenGrad    REDUCE_DX  OF's softmax partials of the hidden-state gradient, merged by
//                            log-sum-exp for the last stage's backward
//   EmbedGrad     BCAST_DE   the first stage's input gradient (root: the first stage's
//                            rank, posted after its backward; sent to each rank); every rank's EB
enum class Coll { EmbedSum, Hidden, Stats, HiddenGrad, EmbedGrad };

// The data-parallel shard collectives of one unit (a layer's weights) of a stage.
enum class ShardOp { GatherW, FreeW, ReduceScatterG };

struct Instr {
  InstrOp op = InstrOp::Compute;
  Action action;  // Compute: the action
  // Send / Recv / Move: the value — the activation or gradient feeding `stage` (the
  // consumer) of `microbatch` — the other rank and the message tag.
  Transfer kind = Transfer::Activation;
  int microbatch = 0, stage = 0;
  int peer = -1, tag = -1;
  // Compute: the last action of its (microbatch, stage): its stashed activations go.
  bool frees_stash = false;
  // Compute: an F that runs overlapped with the next compute, a B or I of another stage (an
  // F&B pair) or an F that does not take its output (an F&F pair; Schedule::pairs); only the
  // F's output (SEND or MOVE) stands between them. The executor interleaves the two where
  // their communication is in flight, the second starting at a pause of the F, and gives
  // the F's output when the F ends. Validated as the list in order (a B cannot need the F's
  // output; an F&F pair's second is checked not to) and with the F's output after the
  // second (whose first step may wait for its input before the F ends).
  bool overlaps_next = false;
  VocabOp vocab = VocabOp::EmbedForward;  // Vocab: which slice (of `microbatch`)
  Coll coll = Coll::EmbedSum;             // Coll: which collective (of `microbatch`; `peer`: its root or -1)
  // Shard: which collective, of unit `unit` of `stage`; `at_layer` -1: between computes,
  // k >= 0: inside the compute it follows (the Shard instructions right after a compute, in
  // the order they run), at that compute's layer k — a gather before the layer's work, a
  // free or a reduce-scatter after it.
  ShardOp shard = ShardOp::GatherW;
  int unit = -1, at_layer = -1;
  bool operator==(const Instr&) const = default;
};

// Sharded data parallelism: the most elements of gathered weights and of whole gradients
// (open, or reduce-scattering) a rank holds at once (validate_shards).
struct ShardPeak {
  int64_t weights = 0, gradients = 0;
  // Of the gradients, those whose reduce-scatter is in flight (kScattersInFlight at most: the
  // transport's scratch), at their most.
  int64_t in_flight = 0;
  int64_t together = 0;  // weights and gradients whole at the same moment, at their most
};

struct Program {
  std::string name;
  int num_stages = 0, num_ranks = 0, num_microbatches = 0;
  bool backward = true;  // false: forward only (evaluation)
  // Vocabulary parallelism: every rank holds a slice of the embedding and the output
  // layer; the first stage's F takes its input from REDUCE_E, the last stage's backward
  // its gradient from REDUCE_DX (collective_input).
  std::vector<int> stage_to_rank;
  std::vector<std::vector<Instr>> per_rank;
  bool vocab_parallel = false;
  // Sharded data parallelism (shard_pass.hpp): the layers of each stage (the units' inside
  // positions refer to them); empty in a program without SHARD instructions.
  std::vector<int> stage_layers;
  std::vector<ShardPeak> shard_peak;  // per rank
};

// The value (kind, microbatch, consumer stage) a compute action takes from another stage
// — F(m, s) the activation from s-1, B/I(m, s) the gradient from s+1 — or gives to one
// (with_gradients = false: a forward-only program sends no gradients). False: none.
bool input_of(const Action& a, int num_stages, Instr& value);
bool output_of(const Action& a, int num_stages, bool with_gradients, Instr& value);
// The collective whose result a compute or vocabulary slice waits for, in a
// vocabulary-parallel program (op Coll, kind and microbatch set). False: none.
bool collective_input(const Program& p, const Instr& in, Instr& coll);
// The rank a collective's data starts from (BCAST_X: the last stage's; BCAST_DE: the
// first stage's) or goes to (REDUCE_E: the first stage's; REDUCE_DX: the last stage's);
// -1 for ALLGATHER_S.
int collective_root(const Program& p, Coll c);
// Whose post of collective c its consumers wait for: a sum's or a gather's, every rank's
// (-1); a broadcast's (BCAST_X, BCAST_DE: the root sends to each rank), the root's alone —
// which on the root is its own post: the data is its own.
int awaited_post(const Program& p, Coll c);
// The stage that produces the value feeding `value.stage`.
int producer_stage(const Instr& value);
// The identity of the value a transfer moves — (kind, microbatch, consumer stage): a SEND,
// its RECV and the compute that consumes it share it.
using ValueKey = std::tuple<int, int, int>;
inline ValueKey value_key(const Instr& i) { return {static_cast<int>(i.kind), i.microbatch, i.stage}; }

struct LowerOptions {
  int recv_lookahead = 4;  // receives are posted for the next N compute actions' inputs
  int tag_ub = 32767;      // MPI_TAG_UB of the communicator that will carry the messages
};

// Lowers a validated schedule (see validate.hpp). Throws pipetrain::Error when the tags
// do not fit under tag_ub.
Program lower(const Schedule& s, const LowerOptions& options = {});

// The evaluation schedule: forward only, microbatch-major (every input comes from an
// earlier microbatch or stage), for the same stage -> rank map.
Schedule forward_only_schedule(const std::vector<int>& stage_to_rank, int num_ranks, int num_microbatches);

// Proves the program executable before any rank runs; throws pipetrain::Error naming the
// rank, the position (1-based, counting every instruction but MOVEs — the cells a
// compute+comms CSV of the program lists) and the instruction: every transfer matched exactly once
// (same tag, the right peers), each receive posted before the compute that uses it and
// each send after the compute that produces it, tags unique per pair of ranks and
// <= tag_ub, every stash freed exactly once, every microbatch through every stage, and
// no deadlock (sends are buffered, a compute waits for its inputs' producers; otherwise
// "deadlock: rank 0 waits at 0B0 (position 5, compute step 2) for the gradient 1SEND_B0
// (rank 1); ..."). Returns the
// peak number of live activation stashes per rank.
// In a vocabulary-parallel program it also proves the slices and collectives
// (validate_vocab): every rank runs each slice of each microbatch once and posts each
// collective once, after the slice or compute whose data it carries and before whatever
// waits for it; OB after OF; and every rank posts the collectives in one order ("rank 1
// posts BCAST_X2 as its collective 7, but rank 0 posts REDUCE_E3"). A deadlock names the
// collective a rank waits for and the ranks that have not posted it.
std::vector<int> validate_program(const Program& p, int tag_ub);
void validate_vocab(const Program& p);

// The stricter semantics of transports that match messages in issue order and run
// them on the compute stream (NCCL: comm.p2p = "nccl"). Each rank runs its list in
// order; the transfers between two computes form one group (ncclGroupStart/End) that
// finishes when each of its messages has met its partner, which happens when the peer's
// head group holds it; the k-th send from a to b is the k-th receive b posts from a.
// Throws pipetrain::Error when the messages of a pair are posted in different orders
// ("rank 0's 2nd send to rank 1 is 0SEND_F1 (position 4), but rank 1's 2nd receive from
// rank 0 is 1RECV_F2 (position 3)") or when the ranks deadlock ("deadlock with in-order
// transfers: rank 0 waits at 0RECV_B0 (position 1) for rank 1's 1SEND_B0 (position 4);
// ..."). validate_program must have passed.
void validate_in_order(const Program& p);
// The program with receives moved earlier until it runs under in-order rules: while a
// send waits for a receive its peer posts later, that receive joins the group the peer
// waits in (per-pair order and "posted before use" are kept). Lowered with
// recv_lookahead = 1 first, receives start next to the previous compute's sends, which
// is what 1f1b-like schedules need; interleaved and looped ones get their receives
// pulled forward. F&B pairs run in order (their marks are cleared: a receive may land
// between the two). Throws validate_in_order's error when no move helps.
Program post_for_in_order(Program p);

// The 1-based position of instruction `index` of `rank`'s list in a compute+comms CSV
// (MOVEs are implicit there, so they do not count).
size_t program_position(const Program& p, int rank, size_t index);

// The program's execution semantics, shared by the validator and the simulator: SEND,
// RECV, MOVE and COLL never block; a compute whose input comes from another rank waits
// until that input's SEND has run; a compute or slice whose input is a collective waits
// until the posts it needs are there (awaited_post). Visits every instruction, rank by rank, as far as each can
// go, calling visit(rank, instruction) in that order; returns where each rank stopped —
// a rank short of its list's end is stuck (all ranks stuck: a deadlock).
std::vector<size_t> walk_program(const Program& p, const std::function<void(int, const Instr&)>& visit);

// "1F0", "0SEND_F1", "1RECV_F1", "1SEND_B0", "0RECV_B0", "1MOVE_F2"; "OF0", "BCAST_X0".
std::string to_string(const Instr& i);

}  // namespace pipetrain
