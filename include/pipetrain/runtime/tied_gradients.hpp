// The tied embedding's two copies (wte on the first stage, for the embedding, and on the
// last, for the LM head) need the sum of their gradients every step. An all-reduce would
// start only when both are final — the first stage's at the very end of the step — and
// both ranks would pay for all of it there. Instead the last stage sends its gradient as
// soon as its head is done with the step (while the first stage still computes), the
// first stage adds it to its own and sends the sum back, and the last stage receives
// that sum only when it needs it (for its optimizer step). Same values as the
// all-reduce (a + b in IEEE arithmetic is commutative); on the critical path, the first
// stage pays one receive and one add instead of a whole all-reduce. The update of the table
// is then done once, by the last stage, which sends the new values back: the first stage —
// the one the pipeline waits for last — skips AdamW over the table's rows.
//
// When the first stage's embedding saw fewer tokens in the step than the table has rows
// (and no data-parallel reducer takes its rows), its gradient is what it is, a few rows:
// the embedding keeps them aside, the other copy is received straight into wte.grad —
// posted when the step begins, so the transfer lands while the first stage waits on its
// pipeline — and the rows are added to it: no dense add of the table on the critical path.
#pragma once
#include <map>
#include <memory>
#include <set>

#include "pipetrain/comm/communicator.hpp"
#include "pipetrain/core/memory_pool.hpp"
#include "pipetrain/model/embedding.hpp"
#include "pipetrain/model/stage.hpp"

namespace pipetrain {

class Backend;

class TiedGradientExchange {
 public:
  // pair: the two-rank communicator of the copies (rank 0 the first stage's, rank 1 the
  // last stage's). stages: this rank's stages (their layers say which one holds wte).
  // send_early: the last stage may send while it still computes — not when the pair's
  // transport runs in stream order (NCCL: the send would hold back the compute queued
  // after it), nor while data-parallel buckets all-reduce wte.grad in place.
  // row_tokens: the tokens the first stage's embedding sees in a step, or 0 when wte.grad
  // is not this rank's alone until finish() (dp all-reduces it first); rows are kept when
  // fewer than the table's. Built after any dp reducer, which has the first claim on them.
  TiedGradientExchange(Parameter& wte, Communicator& pair, const std::map<int, ModelStage*>& stages, Backend& backend,
                       MemoryPool& pool, bool send_early, int64_t row_tokens);
  ~TiedGradientExchange();

  // After wte.grad is zeroed for the step: the first stage keeping rows posts the
  // receive of the other copy (into wte.grad) when the pair's transport allows it.
  void begin_step();
  // Layer `layer` of stage `stage` has its last gradient of the step: on the last
  // stage, the head's layer starts the send.
  void layer_final(int stage, int layer);
  // After the step's program: on return this rank's wte.grad holds the sum on the
  // first stage; on the last, the sum is on its way and receive_sum() must be called
  // before wte.grad is read or written.
  void finish();
  void receive_sum();  // last stage: waits for the sum (no-op on the first stage)
  // Before wte.grad is written again (zeroed for the next step): the first stage's send
  // of the sum must be done with it.
  void settle();
  // The table is updated once, on the last stage (the first stage's optimizer leaves its
  // copy alone: on the first stage the embedding's rows are all the table costs otherwise):
  // after the update, start_values() on the last stage sends the new values, and on the
  // first stage posts their receive into its copy; finish_values() waits for either.
  bool updates_table() const { return !first(); }
  void start_values();
  void finish_values();

 private:
  bool first() const { return pair_.rank() == 0; }
  void start_send();

  Parameter& wte_;
  Communicator& pair_;
  Backend& backend_;
  MemoryPool& pool_;
  bool send_early_;
  std::set<std::pair<int, int>> head_layers_;  // (stage, layer) accumulating into wte on this rank
  Embedding* embedding_ = nullptr;            // first stage keeping its rows in rows_; else null
  EmbeddingRowGradients rows_;
  std::unique_ptr<CommRequest> send_, sum_recv_, other_recv_, values_;
};

}  // namespace pipetrain
