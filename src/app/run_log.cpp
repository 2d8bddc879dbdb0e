#include "pipetrain/app/run_log.hpp"

#include <cstdio>
#include <filesystem>
#include <fmt/format.h>

#include "pipetrain/core/error.hpp"
#include "pipetrain/schedule/render.hpp"

namespace pipetrain {

namespace fs = std::filesystem;

RunLog::RunLog(const Config& cfg, bool append, int rank) : active_(rank == 0), dir_(cfg.log.dir) {
  if (!active_) return;
  const auto mode = append ? std::ios::app : std::ios::trunc;
  if (!dir_.empty()) {
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec) fail("log.dir: cannot create {}: {}", dir_, ec.message());
  }
  std::string metrics = cfg.log.metrics;
  if (metrics.empty() && !dir_.empty()) metrics = (fs::path(dir_) / "metrics.jsonl").string();
  if (!metrics.empty()) {
    metrics_.open(metrics, mode);
    if (!metrics_) fail("log.metrics: cannot write {}", metrics);
  }
  if (!cfg.log.file.empty()) {
    file_.open(cfg.log.file, mode);
    if (!file_) fail("log.file: cannot write {}", cfg.log.file);
  }
}

void RunLog::line(const std::string& text) {
  if (!active_) return;
  fmt::print("{}\n", text);
  std::fflush(stdout);
  if (file_.is_open()) {
    file_ << text << '\n';
    file_.flush();
  }
}

void RunLog::metrics(const nlohmann::json& row) {
  if (!active_ || !metrics_.is_open()) return;
  metrics_ << row.dump() << '\n';
  metrics_.flush();
}

void RunLog::run_files(const Config& cfg, const nlohmann::json& run_info, const Schedule& s, const SimResult& sim) {
  if (!active_ || dir_.empty()) return;
  const fs::path d(dir_);
  std::ofstream(d / "run.json") << run_info.dump(2) << '\n';
  std::ofstream(d / "config.toml") << to_toml(cfg);
  std::ofstream(d / "schedule_sim.json") << render_chrome_trace(s, sim) << '\n';
}

}  // namespace pipetrain
