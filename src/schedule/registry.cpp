// The schedule registry (pipetrain/schedule/registry.hpp) and its built-in table.
#include "pipetrain/schedule/registry.hpp"

#include <fmt/format.h>

#include <mutex>

#include "pipetrain/core/error.hpp"
#include "pipetrain/schedule/builtins.hpp"

namespace pipetrain {
namespace {

struct Entry {
  std::string name, description;
  ScheduleGenerator generator;
};

// Built-ins: one line each. A new schedule = a generator function + one line here.
std::vector<Entry> builtin_entries() {
  return {
      {"gpipe", "GPipe: every rank runs all forwards, then all backwards", gpipe_schedule},
      {"1f1b", "1F1B (PipeDream-flush): warm-up forwards, then one forward/one backward",
       one_f_one_b_schedule},
      {"interleaved-1f1b",
       "Megatron interleaved 1F1B: v stages per rank, loop placement, m divisible by ranks",
       interleaved_1f1b_schedule},
      {"looped-bfs", "Looped BFS: loop placement, each local stage for all microbatches in turn",
       looped_bfs_schedule},
      {"zb-h1", "ZB-H1 zero bubble: 1F1B with B split into I and W, W fills the bubbles",
       zb_h1_schedule},
      {"zbv", "ZB-V zero bubble: V placement, 2 stages per rank, I/W split",
       zbv_schedule},
      {"dualpipev",
       "DualPipeV (DeepSeek) order: V placement, 2 stages per rank, m >= 2*ranks, F&B not "
       "overlapped",
       dualpipev_schedule},
  };
}

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

std::vector<Entry>& entries() {
  static std::vector<Entry> e = builtin_entries();
  return e;
}

}  // namespace

void register_schedule(std::string name, std::string description, ScheduleGenerator gen) {
  if (name.empty()) fail("register_schedule: empty schedule name");
  if (!gen) fail("register_schedule: schedule '{}' has no generator", name);
  std::lock_guard lock(registry_mutex());
  for (auto& e : entries()) {
    if (e.name == name) {
      e.description = std::move(description);
      e.generator = std::move(gen);
      return;
    }
  }
  entries().push_back({std::move(name), std::move(description), std::move(gen)});
}

Schedule make_schedule(const std::string& name, const ScheduleParams& params) {
  ScheduleGenerator gen;
  std::string known;
  {
    std::lock_guard lock(registry_mutex());
    for (const auto& e : entries()) {
      if (e.name == name) gen = e.generator;
      known += known.empty() ? e.name : ", " + e.name;
    }
  }
  if (!gen) fail("unknown schedule '{}' (known: {})", name, known);
  if (params.ranks < 1) fail("{}: ranks must be at least 1 (got {})", name, params.ranks);
  if (params.stages_per_rank < 1)
    fail("{}: stages per rank must be at least 1 (got {})", name, params.stages_per_rank);
  if (params.microbatches < 1)
    fail("{}: microbatches must be at least 1 (got {})", name, params.microbatches);
  Schedule s = gen(params);
  if (s.name.empty()) s.name = name;
  return s;
}

std::vector<std::pair<std::string, std::string>> list_schedules() {
  std::lock_guard lock(registry_mutex());
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& e : entries()) out.emplace_back(e.name, e.description);
  return out;
}

Schedule new_schedule(const std::string& name, const ScheduleParams& p, bool v_shape) {
  Schedule s;
  s.name = name;
  s.num_ranks = p.ranks;
  s.num_stages = p.ranks * p.stages_per_rank;
  s.num_microbatches = p.microbatches;
  s.stage_to_rank =
      v_shape ? v_placement(s.num_stages, p.ranks) : loop_placement(s.num_stages, p.ranks);
  s.per_rank.assign(static_cast<size_t>(p.ranks), {});
  return s;
}

}  // namespace pipetrain
