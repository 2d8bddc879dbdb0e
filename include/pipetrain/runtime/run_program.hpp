// What a config asks the pipeline to run: its schedule and how that schedule's program is
// built (schedule/program_builder.hpp). The Trainer and `pipetrain check` both ask here.
#pragma once
#include <string>

#include "pipetrain/core/config.hpp"
#include "pipetrain/schedule/program_builder.hpp"
#include "pipetrain/schedule/schedule.hpp"

namespace pipetrain {

// The schedule a config asks for (schedule.name, or schedule.file with
// schedule.placement), for `pp` pipeline ranks; validated. When schedule.file is a
// compute+comms file, its text goes to *comms_csv (the file is read once).
Schedule schedule_from_config(const Config& cfg, std::string* comms_csv = nullptr);
// How its program is built (schedule/program_builder.hpp): `comms_csv` a compute+comms
// file's text (run exactly as written); `tag_ub` the pipeline communicator's tag bound;
// `in_order` its transport matches messages in posting order (NCCL); `vocab_parallel` the
// slices' program (choose_vocab_parallel's decision), placed by FLOP ratios.
ProgramRecipe program_recipe(const Config& cfg, const Schedule& s, const std::string& comms_csv, int tag_ub,
                             bool in_order, bool vocab_parallel);

}  // namespace pipetrain
