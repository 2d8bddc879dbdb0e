// `pipetrain report`: one self-contained HTML page (inline CSS and SVG, no scripts)
// from a run directory written with log.dir (see pipetrain/app/run_log.hpp): the run's
// setup, loss / throughput / learning-rate / bubble / MFU curves, the measured pipeline
// timeline of one step beside the simulated one, and per-rank busy/idle shares.
// Exports: render_report.
#pragma once
#include <string>

namespace pipetrain {

// The page for `run_dir`. `metrics_file` ("" = RUN_DIR/metrics.jsonl) names the metrics
// rows when the run wrote them elsewhere (log.metrics). run.json, config.toml,
// schedule_sim.json, trace.json, val_loss and mfu are optional: the page says "not
// recorded" where one is missing. Throws pipetrain::Error naming the path when run_dir
// is not a directory or the metrics file is missing or unreadable.
std::string render_report(const std::string& run_dir, const std::string& metrics_file = "");

}  // namespace pipetrain
