// dualpipev_schedule (builtins.hpp): the per-rank order of DeepSeek's DualPipeV (the
// "cut-in-half" DualPipe) on V placement: rank r holds chunk 0 = stage r and chunk 1 =
// stage 2p-1-r. Its eight phases, for p ranks and m >= 2p microbatches:
//   1 nF0      (p-r-1)*2 forwards of chunk 0
//   2 nF0F1    r+1 times: F chunk 0, F chunk 1
//   3 nB1W1F1  p-r-1 times: I chunk 1, W (of that I), F chunk 1
//   4 nF0B1F1B0  m-2p+r+1 times: (F chunk 0 & B chunk 1), (F chunk 1 & B chunk 0)
//   5 nB1F1B0  p-r-1 times: B chunk 1, (F chunk 1 & B chunk 0)
//   6 nB1B0    r+1 times: backward chunk 1, backward chunk 0; from the middle iteration
//              on they are split (I, with W queued)
//   7 nWB0     p-r-1 times: W (oldest queued), I chunk 0 (W queued)
//   8 nW       the r+1 queued W's
// Each "&" is an F&B pair (Schedule::pairs): the executor overlaps the forward's and the
// backward's communication with the other's compute, as DualPipeV does on two streams.
// pipetrain's addition: in phases 1 and 2 each forward also pairs with the next when that
// one does not take its output (F&F; the first leads, the second fills its exchanges), so
// the warm-up's exchanges, with no backward yet to hide behind, are hidden too.
// Needs exactly 2 stages per rank and m >= 2p.
#include <deque>

#include "pipetrain/core/error.hpp"
#include "pipetrain/schedule/builtins.hpp"

namespace pipetrain {
namespace {

class RankProgram {
 public:
  RankProgram(int rank, int ranks, std::vector<Action>& out, std::vector<int>& pairs)
      : stage_{rank, 2 * ranks - 1 - rank}, out_(out), pairs_(pairs) {}

  void forward(int chunk) { out_.push_back({Op::F, fwd_[chunk]++, stage_[chunk]}); }
  void backward(int chunk, bool zero_bubble) {
    const Action a{zero_bubble ? Op::I : Op::B, bwd_[chunk]++, stage_[chunk]};
    out_.push_back(a);
    if (zero_bubble) weights_.push_back({Op::W, a.microbatch, a.stage});
  }
  void weight() {
    out_.push_back(weights_.front());
    weights_.pop_front();
  }
  void forward_backward(int fchunk, int bchunk) {
    pairs_.push_back(static_cast<int>(out_.size()));
    forward(fchunk);
    backward(bchunk, false);
  }
  // Pairs each forward so far with the next unless that takes its output (the same
  // microbatch's next stage: a MOVE between them).
  void pair_forwards() {
    for (size_t i = 0; i + 1 < out_.size(); ++i) {
      const Action &a = out_[i], &b = out_[i + 1];
      if (b.microbatch == a.microbatch && b.stage == a.stage + 1) continue;
      pairs_.push_back(static_cast<int>(i++));
    }
  }

 private:
  int stage_[2];
  int fwd_[2] = {0, 0}, bwd_[2] = {0, 0};
  std::deque<Action> weights_;
  std::vector<Action>& out_;
  std::vector<int>& pairs_;
};

}  // namespace

Schedule dualpipev_schedule(const ScheduleParams& p) {
  if (p.stages_per_rank != 2)
    fail("dualpipev needs exactly 2 stages per rank (V placement; got {})", p.stages_per_rank);
  if (p.microbatches < 2 * p.ranks)
    fail("dualpipev needs microbatches >= 2 * ranks (got {} microbatches, {} ranks)",
         p.microbatches, p.ranks);
  Schedule s = new_schedule("dualpipev", p, true);
  const int R = p.ranks, m = p.microbatches;
  s.pairs.resize(static_cast<size_t>(R));
  for (int r = 0; r < R; ++r) {
    RankProgram prog(r, R, s.per_rank[static_cast<size_t>(r)], s.pairs[static_cast<size_t>(r)]);
    for (int i = 0; i < (R - r - 1) * 2; ++i) prog.forward(0);  // 1
    for (int i = 0; i < r + 1; ++i) {                             // 2
      prog.forward(0);
      prog.forward(1);
    }
    prog.pair_forwards();
    for (int i = 0; i < R - r - 1; ++i) {  // 3
      prog.backward(1, true);
      prog.weight();
      prog.forward(1);
    }
    for (int i = 0; i < m - 2 * R + r + 1; ++i) {  // 4
      prog.forward_backward(0, 1);
      prog.forward_backward(1, 0);
    }
    for (int i = 0; i < R - r - 1; ++i) {  // 5
      prog.backward(1, false);
      prog.forward_backward(1, 0);
    }
    const int step6 = r + 1;  // 6
    bool zb = false;
    for (int i = 0; i < step6; ++i) {
      if (i == step6 / 2 && r % 2 == 1) zb = true;
      prog.backward(1, zb);
      if (i == step6 / 2 && r % 2 == 0) zb = true;
      prog.backward(0, zb);
    }
    for (int i = 0; i < R - r - 1; ++i) {  // 7
      prog.weight();
      prog.backward(0, true);
    }
    for (int i = 0; i < r + 1; ++i) prog.weight();  // 8
  }
  return s;
}

}  // namespace pipetrain
