// `pipetrain report RUN_DIR [-o FILE.html] [--metrics FILE.jsonl]`: add_report_command
// (declared in pipetrain/app/commands.hpp). Writes the page of render_report (default
// RUN_DIR/report.html); runs on rank 0 only when launched with more ranks.
#include <mpi.h>

#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <memory>
#include <string>

#include "pipetrain/app/commands.hpp"
#include "pipetrain/app/report.hpp"
#include "pipetrain/core/error.hpp"

namespace pipetrain {

namespace {

struct ReportOptions {
  std::string run_dir;
  std::string out;
  std::string metrics;
};

int run_report(const ReportOptions& o) {
  if (!is_world_rank0()) return 0;
  const std::string html = render_report(o.run_dir, o.metrics);
  const std::string out = o.out.empty() ? (std::filesystem::path(o.run_dir) / "report.html").string() : o.out;
  std::ofstream f(out, std::ios::binary | std::ios::trunc);
  if (!f) fail("report: cannot write {}", out);
  f << html;
  f.close();
  if (!f) fail("report: cannot write {}", out);
  fmt::print("wrote {} ({:.0f} KiB)\n", out, static_cast<double>(html.size()) / 1024.0);
  return 0;
}

}  // namespace

void add_report_command(CLI::App& app, CommandRunner& runner) {
  auto o = std::make_shared<ReportOptions>();
  CLI::App* sub = app.add_subcommand("report", "Render a run directory (log.dir) as one self-contained HTML page");
  sub->add_option("run_dir", o->run_dir, "Run directory written by `pipetrain train` with log.dir")->required();
  sub->add_option("-o,--output", o->out, "HTML file to write (default RUN_DIR/report.html)");
  sub->add_option("--metrics", o->metrics, "Metrics rows, when the run wrote them elsewhere (log.metrics)");
  sub->callback([o, &runner] { runner = [o] { return run_report(*o); }; });
}

}  // namespace pipetrain
