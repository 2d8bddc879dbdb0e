// A run's plan from its config (plan/run_plan.hpp), and the schedule and program recipe it asks for.
#include "pipetrain/plan/run_plan.hpp"

#include <algorithm>
#include <climits>
#include <string>

#include "pipetrain/core/error.hpp"
#include "pipetrain/plan/shard_plan.hpp"
#include "pipetrain/plan/vocab_choice.hpp"
#include "pipetrain/schedule/csv.hpp"
#include "pipetrain/schedule/program_csv.hpp"
#include "pipetrain/schedule/registry.hpp"
#include "pipetrain/schedule/validate.hpp"

namespace pipetrain {

RunPlan plan_run(const Config& cfg) {
  RunPlan plan;
  plan.layout = layout_of(cfg);
  plan.vocab_reason = choose_vocab_parallel(cfg).reason;
  plan.schedule = schedule_from_config(cfg, &plan.comms_csv);
  const Recompute mode = parse_recompute(cfg.train.recompute);
  const auto& listed = cfg.parallel.recompute_stages;
  for (int s = 0; s < plan.schedule.num_stages; ++s)
    plan.stage_recompute.push_back(
        listed.empty() || std::find(listed.begin(), listed.end(), s) != listed.end() ? mode : Recompute::None);
  plan.pack_all = cfg.runtime.pack_weights == Toggle::On;
  return plan;
}

std::vector<StageUnits> stage_split(const ModelConfig& model, int stages, const std::vector<double>& given,
                                    bool vocab_parallel, const UnitCosts& costs) {
  // Under vocabulary parallelism every rank carries the same share of the embedding and
  // the output layer: what the first and last stage keep (positions, final norm) is small.
  return partition_stages(model, stages, static_cast<int>(given.size()) == stages ? given : std::vector<double>{},
                          vocab_parallel ? costs.vocabulary_parallel() : costs);
}

void split_stages(RunPlan& plan, const Config& cfg, const UnitCosts& costs) {
  const bool vp = plan.layout.vocab_parallel;
  plan.unit_costs = vp ? costs.vocabulary_parallel() : costs;
  plan.split = stage_split(cfg.model, plan.schedule.num_stages, cfg.parallel.layers_per_stage, vp, costs);
}

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

ProgramRecipe program_recipe(const ModelConfig& model, const Layout& l, int stages, int tag_ub, bool in_order) {
  ProgramRecipe r;
  r.tag_ub = tag_ub;
  r.in_order = in_order;
  r.vocab_parallel = l.vocab_parallel;
  if (r.vocab_parallel) r.vocab_costs = vocab_placement_costs(model, l, stages);
  return r;
}

ProgramRecipe program_recipe(const Config& cfg, const RunPlan& plan, int tag_ub, bool in_order) {
  ProgramRecipe r = program_recipe(cfg.model, plan.layout, plan.schedule.num_stages, tag_ub, in_order);
  r.comms_csv = plan.comms_csv;
  r.file = cfg.schedule.file;
  r.placement = cfg.schedule.placement;
  r.shard = shard_placement(plan.layout);
  if (r.shard.any()) {  // (a plan not yet split, `check`'s: the config's split, or the cost model's balance)
    const std::vector<StageUnits> split =
        plan.split.empty() ? stage_split(cfg.model, plan.schedule.num_stages, cfg.parallel.layers_per_stage,
                                         plan.layout.vocab_parallel, UnitCosts{})
                           : plan.split;
    r.units = shard_units(cfg.model, plan.layout, plan.schedule, split);
  }
  return r;
}

}  // namespace pipetrain
