// RunLog: what rank 0 tells the user during a run. Progress lines go to stdout (and to
// log.file); per-step rows to the metrics JSON Lines file; with log.dir, a run directory
// that `pipetrain report` turns into a page:
//   DIR/run.json           grid, schedule, model size, tokens per step, peak FLOP/s
//   DIR/config.toml        the full config
//   DIR/metrics.jsonl      one row per step (unless log.metrics names another file)
//   DIR/schedule_sim.json  the simulated schedule as a Chrome trace (1 cost unit = 1 ms)
//   DIR/trace.json         the measured execution of the first steps (all ranks)
#pragma once
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "pipetrain/core/config.hpp"
#include "pipetrain/schedule/simulate.hpp"

namespace pipetrain {

class RunLog {
 public:
  // Only rank 0 writes; `append` continues the files of a resumed run.
  RunLog(const Config& cfg, bool append, int rank);
  void line(const std::string& text);  // one progress line (newline added)
  void metrics(const nlohmann::json& row);
  void run_files(const Config& cfg, const nlohmann::json& run_info, const Schedule& s, const SimResult& sim);
  // Where the measured trace goes ("" = nowhere): --trace DIR, else log.dir.
  std::string trace_dir(const std::string& option) const { return option.empty() ? dir_ : option; }

 private:
  bool active_;
  std::string dir_;
  std::ofstream metrics_, file_;
};

}  // namespace pipetrain
