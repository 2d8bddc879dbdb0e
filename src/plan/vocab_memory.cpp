// add_vocab_memory, add_vocab_memory_bound (pipetrain/plan/vocab_memory.hpp).
#include "pipetrain/plan/vocab_memory.hpp"

#include <algorithm>

#include "pipetrain/model/stage.hpp"

namespace pipetrain {

namespace {
void add_slices_and_buffers(int alive, int most_partials, const ModelConfig& model, int slices, int B, int T,
                            DType storage, MemoryInputs& in) {
  in.vocab_inflight = alive + 1;  // and OF's working copy, from which it forms the partials
  in.vocab_stash = vocab_stash_bytes(model, slices, B, T, storage);
  in.vocab_buffers = (3.0 + 2.0 * most_partials) * B * T * model.d_model * 4.0;
}
}  // namespace

void add_vocab_memory(const Program& prog, int rank, int peak_inflight, const ModelConfig& model, int slices, int B,
                      int T, DType storage, MemoryInputs& in) {
  in.peak_inflight = peak_inflight;
  const bool last = prog.stage_to_rank.back() == rank;
  int alive = 0, most_alive = 0, partials = 0, most_partials = 1;
  for (const Instr& i : prog.per_rank[static_cast<size_t>(rank)]) {
    if (i.op == InstrOp::Coll && i.coll == Coll::HiddenGrad && last)
      most_partials = std::max(most_partials, ++partials);
    if (i.op == InstrOp::Compute && i.action.op != Op::F && i.action.op != Op::W &&
        i.action.stage == prog.num_stages - 1)
      --partials;
    if (i.op != InstrOp::Vocab) continue;
    if (i.vocab == VocabOp::OutputForward) most_alive = std::max(most_alive, ++alive);
    if (i.vocab == VocabOp::OutputBackward) --alive;
  }
  add_slices_and_buffers(most_alive, most_partials, model, slices, B, T, storage, in);
}

void add_vocab_memory_bound(bool last_stage, int microbatches, const ModelConfig& model, int slices, int B, int T,
                            DType storage, MemoryInputs& in) {
  in.peak_inflight = std::min(in.peak_inflight + 2, microbatches);
  add_slices_and_buffers(std::min(5, microbatches), last_stage ? std::min(3, microbatches) : 1, model, slices, B, T,
                         storage, in);
}

}  // namespace pipetrain
