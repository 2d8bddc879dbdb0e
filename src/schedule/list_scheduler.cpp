// list_schedule() of pipetrain/schedule/list_scheduler.hpp.
#include "pipetrain/schedule/list_scheduler.hpp"

#include <limits>
#include <optional>

#include "pipetrain/core/error.hpp"

namespace pipetrain {
namespace {

constexpr double kNotRun = std::numeric_limits<double>::infinity();

class Planner {
 public:
  explicit Planner(ListSchedulerSpec& spec)
      : sp_(spec), S_(spec.base.num_stages), M_(spec.base.num_microbatches) {
    end_.assign(3 * static_cast<size_t>(S_) * static_cast<size_t>(M_), kNotRun);
    next_.assign(3 * static_cast<size_t>(S_), 0);
    const auto R = static_cast<size_t>(spec.base.num_ranks);
    free_.assign(R, 0.0);
    inflight_.assign(R, 0);
    stages_.resize(R);
    for (int s = 0; s < S_; ++s)
      stages_[static_cast<size_t>(spec.base.stage_to_rank[static_cast<size_t>(s)])].push_back(s);
    sp_.base.per_rank.assign(R, {});
  }

  void run() {
    const int R = sp_.base.num_ranks;
    size_t remaining = static_cast<size_t>(S_) * static_cast<size_t>(M_) *
                       (sp_.split_backward ? 3u : 2u);
    double t = 0;
    while (remaining > 0) {
      bool any = false;
      for (int r = 0; r < R; ++r) {
        if (free_[static_cast<size_t>(r)] > t) continue;
        if (auto a = pick(r, t, false)) {
          place(r, *a, t);
          --remaining;
          any = true;
        }
      }
      double next = kNotRun;
      for (double f : free_)
        if (f > t && f < next) next = f;
      if (next == kNotRun && remaining > 0 && !any) {
        // Stuck only on caps: let the lowest rank with a ready forward exceed its cap.
        bool relaxed = false;
        for (int r = 0; r < R && !relaxed; ++r) {
          if (auto a = pick(r, t, true)) {
            place(r, *a, t);
            --remaining;
            relaxed = true;
          }
        }
        if (!relaxed) fail("list scheduler for '{}' is stuck (internal error)", sp_.base.name);
        continue;
      }
      if (next != kNotRun) t = next;
    }
  }

 private:
  // Kind index: 0 = F, 1 = B or I, 2 = W.
  size_t idx(int kind, int stage, int mb) const {
    return (static_cast<size_t>(kind) * static_cast<size_t>(S_) + static_cast<size_t>(stage)) *
               static_cast<size_t>(M_) +
           static_cast<size_t>(mb);
  }
  int& next_mb(int kind, int stage) {
    return next_[static_cast<size_t>(kind) * static_cast<size_t>(S_) + static_cast<size_t>(stage)];
  }
  bool done(int kind, int stage, int mb, double t) const { return end_[idx(kind, stage, mb)] <= t; }

  bool ready(int kind, int stage, int mb, double t) const {
    if (kind == 0) return stage == 0 || done(0, stage - 1, mb, t);
    if (kind == 1) return done(0, stage, mb, t) && (stage == S_ - 1 || done(1, stage + 1, mb, t));
    return done(1, stage, mb, t);
  }

  std::optional<Action> pick(int r, double t, bool ignore_cap) {
    std::optional<Action> best;
    std::array<int, 4> best_key{};
    const int kinds = sp_.split_backward ? 3 : 2;
    for (int s : stages_[static_cast<size_t>(r)]) {
      for (int kind = 0; kind < kinds; ++kind) {
        const int mb = next_mb(kind, s);
        if (mb >= M_ || !ready(kind, s, mb, t)) continue;
        if (kind == 0 && inflight_[static_cast<size_t>(r)] >= sp_.inflight_cap[static_cast<size_t>(r)] &&
            !ignore_cap)
          continue;
        if (ignore_cap && kind != 0) continue;
        const Op op = kind == 0 ? Op::F : kind == 2 ? Op::W : sp_.split_backward ? Op::I : Op::B;
        const Action a{op, mb, s};
        const auto key = sp_.priority(r, a);
        if (!best || key < best_key) {
          best = a;
          best_key = key;
        }
      }
    }
    return best;
  }

  void place(int r, const Action& a, double t) {
    const int kind = a.op == Op::F ? 0 : a.op == Op::W ? 2 : 1;
    const double end = t + sp_.costs.of(a.op);
    end_[idx(kind, a.stage, a.microbatch)] = end;
    ++next_mb(kind, a.stage);
    free_[static_cast<size_t>(r)] = end;
    if (a.op == Op::F) ++inflight_[static_cast<size_t>(r)];
    if (a.op == Op::B || a.op == Op::W) --inflight_[static_cast<size_t>(r)];
    sp_.base.per_rank[static_cast<size_t>(r)].push_back(a);
  }

  ListSchedulerSpec& sp_;
  int S_, M_;
  std::vector<double> end_;
  std::vector<int> next_;
  std::vector<double> free_;
  std::vector<int> inflight_;
  std::vector<std::vector<int>> stages_;
};

}  // namespace

Schedule list_schedule(ListSchedulerSpec spec) {
  if (static_cast<int>(spec.inflight_cap.size()) != spec.base.num_ranks)
    fail("list scheduler for '{}': {} caps for {} ranks", spec.base.name, spec.inflight_cap.size(),
         spec.base.num_ranks);
  Planner(spec).run();
  return std::move(spec.base);
}

}  // namespace pipetrain
