// The schedule and the program recipe a config asks for (runtime/run_program.hpp).
#include "pipetrain/runtime/run_program.hpp"

#include <climits>
#include <string>

#include "pipetrain/core/error.hpp"
#include "pipetrain/plan/vocab_choice.hpp"
#include "pipetrain/schedule/csv.hpp"
#include "pipetrain/schedule/program_csv.hpp"
#include "pipetrain/schedule/registry.hpp"
#include "pipetrain/schedule/validate.hpp"

namespace pipetrain {

Schedule schedule_from_config(const Config& cfg, std::string* comms_csv) {
  const auto& p = cfg.parallel;
  Schedule s;
  if (!cfg.schedule.file.empty()) {
    std::string text;
    try {
      text = read_schedule_text(cfg.schedule.file);
    } catch (const Error& e) {
      fail("schedule.file: {}", e.what());
    }
    // A compute+comms file: its compute cells are the schedule (tags are fixed later).
    const bool comms = is_comms_csv(text);
    s = comms ? compute_only(program_from_csv(text, cfg.schedule.file, cfg.schedule.placement, INT_MAX))
              : from_csv(text, cfg.schedule.file, cfg.schedule.placement);
    if (comms && comms_csv) *comms_csv = std::move(text);
    if (s.num_ranks != p.pp)
      fail("{}: the schedule has {} ranks but parallel.pp = {}", cfg.schedule.file, s.num_ranks, p.pp);
    if (s.num_stages != p.pp * p.virtual_stages)
      fail("{}: the schedule has {} stages but parallel.pp * parallel.virtual_stages = {}", cfg.schedule.file,
           s.num_stages, p.pp * p.virtual_stages);
    if (s.num_microbatches != cfg.train.microbatches)
      fail("{}: the schedule runs {} microbatches but train.microbatches = {}", cfg.schedule.file, s.num_microbatches,
           cfg.train.microbatches);
  } else {
    try {
      s = make_schedule(cfg.schedule.name, ScheduleParams{p.pp, p.virtual_stages, cfg.train.microbatches});
    } catch (const Error& e) {
      fail("schedule.name: {}", e.what());
    }
  }
  validate(s);
  return s;
}

ProgramRecipe program_recipe(const Config& cfg, const Schedule& s, const std::string& comms_csv, int tag_ub,
                             bool in_order, bool vocab_parallel) {
  ProgramRecipe r;
  r.tag_ub = tag_ub;
  r.in_order = in_order;
  r.vocab_parallel = vocab_parallel;
  if (vocab_parallel) r.vocab_costs = vocab_placement_costs(cfg.model, cfg.parallel, s.num_stages);
  r.comms_csv = comms_csv;
  r.file = cfg.schedule.file;
  r.placement = cfg.schedule.placement;
  return r;
}

}  // namespace pipetrain
