// Trainer's microbatches (pipetrain/runtime/trainer.hpp): what each rank loads of a step's
// samples (its chunks of every sequence under context parallelism), and evaluation.
#include <vector>

#include "pipetrain/core/error.hpp"
#include "pipetrain/core/fault.hpp"
#include "pipetrain/model/ring_attention.hpp"
#include "pipetrain/runtime/trainer.hpp"

namespace pipetrain {

MicrobatchLoader Trainer::loader(const BatchSource& source, int64_t first) const {
  const int cp = grid_.shape().cp;
  if (cp == 1)
    return [&source, first, B = microbatch_size()](int m, int32_t* in, int32_t* tgt, int32_t* pos) {
      source.load(first + static_cast<int64_t>(m) * B, B, in, tgt, pos);
    };
  // Context parallelism: whole samples, of which this rank keeps chunks cp_rank and
  // 2 cp - 1 - cp_rank of every sequence, at their global positions (packed documents:
  // their document positions; the executor finds each document's start from both).
  return [&source, first, B = microbatch_size(), T = cfg_.train.seq_len, packed = source.is_packed(),
          mine = ring_positions(cfg_.train.seq_len, cp, grid_.coords().cp)](int m, int32_t* in, int32_t* tgt,
                                                                            int32_t* pos) {
    const size_t Tl = mine.size();
    const size_t whole = static_cast<size_t>(B) * static_cast<size_t>(T);
    std::vector<int32_t> whole_in(in ? whole : 0), whole_tgt(tgt ? whole : 0), whole_pos(pos && packed ? whole : 0);
    if (in || tgt || !whole_pos.empty())
      source.load(first + static_cast<int64_t>(m) * B, B, in ? whole_in.data() : nullptr,
                  tgt ? whole_tgt.data() : nullptr, whole_pos.empty() ? nullptr : whole_pos.data());
    for (size_t b = 0; b < static_cast<size_t>(B); ++b)
      for (size_t i = 0; i < Tl; ++i) {
        const size_t from = b * static_cast<size_t>(T) + static_cast<size_t>(mine[i]), to = b * Tl + i;
        if (in) in[to] = whole_in[from];
        if (tgt) tgt[to] = whole_tgt[from];
        if (pos) pos[to] = packed ? whole_pos[from] : mine[i];
      }
  };
}

double Trainer::evaluate(const BatchSource& source, int64_t first, int count) {
  fault::point("eval");
  const int dp = grid_.shape().dp;
  const int per_replica = count / dp / microbatch_size();  // whole microbatches per replica
  if (per_replica == 0) fail("evaluation needs at least {} samples, got {}", dp * microbatch_size(), count);
  const int64_t mine = first + static_cast<int64_t>(grid_.coords().dp) * per_replica * microbatch_size();
  if (source.is_packed() != source_.is_packed())
    fail("evaluation: the validation data {} documents while the training data {}",
         source.is_packed() ? "packs" : "does not pack", source_.is_packed() ? "does" : "does not");
  const MicrobatchLoader load = loader(source, mine);
  const Program& program = eval_program(per_replica);
  ExecutorHooks hooks;
  sync_->shard_hooks(hooks);
  const ExecutorStats st = executor_->run(program.per_rank[static_cast<size_t>(grid_.coords().pp)], load,
                                          microbatch_size(), local_seq_len(), 0.0f, false, hooks);
  double sum = grid_.coords().tp == 0 ? st.loss_sum : 0.0;
  grid_.world().allreduce_sum(&sum, 1);
  const int64_t samples = static_cast<int64_t>(per_replica) * dp * microbatch_size();
  return sum / static_cast<double>(source.is_packed() ? source.targets(first, static_cast<int>(samples))
                                                      : samples * cfg_.train.seq_len);
}

}  // namespace pipetrain
