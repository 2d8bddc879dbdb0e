// render_report() of pipetrain/app/report.hpp: a run directory -> one HTML page.
#include "pipetrain/app/report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "pipetrain/app/svg_plot.hpp"
#include "pipetrain/core/error.hpp"

namespace pipetrain {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::optional<std::string> read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// An optional JSON file: nullopt when absent; `problem` says why one could not be used.
std::optional<json> read_json(const fs::path& path, std::string& problem) {
  const auto text = read_text(path);
  if (!text) return std::nullopt;
  try {
    return json::parse(*text);
  } catch (const json::exception& e) {
    problem = fmt::format("{} could not be parsed: {}", path.string(), e.what());
    return std::nullopt;
  }
}

double num(const json& j, const char* key) {
  if (!j.is_object()) return kNaN;
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : kNaN;
}

// A run.json value as text ("not recorded" when absent).
std::string field(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key)) return "not recorded";
  const json& v = j[key];
  return v.is_string() ? v.get<std::string>() : v.dump();
}

std::string human(double x) {
  if (!std::isfinite(x)) return "n/a";
  const char* units[] = {"", "K", "M", "G", "T", "P"};
  int u = 0;
  while (std::abs(x) >= 1000.0 && u < 5) x /= 1000.0, ++u;
  return fmt::format("{:.2f}{}", x, units[u]);
}

std::string pct(double f) { return std::isfinite(f) ? fmt::format("{:.1f}%", 100.0 * f) : "n/a"; }

std::string note(const std::string& text) { return "<p class=\"note\">" + xml_escape(text) + "</p>\n"; }

// One row per step (the last row wins when a resumed run logged a step twice), by step.
std::vector<json> load_metrics(const fs::path& path) {
  std::ifstream in(path);
  if (!in) fail("report: cannot read the metrics file {}", path.string());
  std::map<int64_t, json> by_step;
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    if (line.find_first_not_of(" \t\r") != std::string::npos) lines.push_back(line);
  for (size_t i = 0; i < lines.size(); ++i) {
    json row;
    try {
      row = json::parse(lines[i]);
    } catch (const json::exception&) {
      if (i + 1 == lines.size()) break;  // a run killed mid-write: drop the torn last line
      fail("report: {} line {} is not JSON", path.string(), i + 1);
    }
    if (!row.is_object() || !row.contains("step") || !row["step"].is_number())
      fail("report: {} line {} has no \"step\"", path.string(), i + 1);
    const auto step = row["step"].get<int64_t>();  // before the move (= evaluates its right side first)
    by_step[step] = std::move(row);
  }
  std::vector<json> rows;
  for (auto& [step, row] : by_step) rows.push_back(std::move(row));
  return rows;
}

std::vector<double> column(const std::vector<json>& rows, const char* key, double scale = 1) {
  std::vector<double> v;
  for (const auto& r : rows) v.push_back(num(r, key) * scale);
  return v;
}

bool any_finite(const std::vector<double>& v) {
  return std::any_of(v.begin(), v.end(), [](double x) { return std::isfinite(x); });
}

double median(std::vector<double> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return !std::isfinite(x); }), v.end());
  if (v.empty()) return kNaN;
  std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

double max_of(const std::vector<double>& v) {
  double m = kNaN;
  for (double x : v)
    if (std::isfinite(x) && !(x <= m)) m = x;
  return m;
}

std::string table_row(const std::string& key, const std::string& value) {
  return "<tr><th>" + xml_escape(key) + "</th><td>" + xml_escape(value) + "</td></tr>\n";
}

std::string header_section(const std::optional<json>& run, const std::string& run_problem,
                           const std::optional<std::string>& config, const std::vector<json>& rows) {
  std::string h = "<section id=\"setup\">\n<h2>Run</h2>\n<div class=\"tables\">\n<table>\n<caption>run.json</caption>\n";
  if (run) {
    const json& r = *run;
    const json grid = r.is_object() && r.contains("grid") ? r["grid"] : json::object();
    h += table_row("config", field(r, "config"));
    h += table_row("grid", fmt::format("dp {} \u00d7 pp {} \u00d7 tp {} = {} ranks", field(grid, "dp"),
                                       field(grid, "pp"), field(grid, "tp"), field(r, "world_size")));
    h += table_row("schedule", fmt::format("{}: {} stages, {} microbatches", field(r, "schedule"),
                                           field(r, "num_stages"), field(r, "microbatches")));
    const double params = num(r, "model_params");
    h += table_row("model parameters",
                   std::isfinite(params) ? fmt::format("{} ({:.0f})", human(params), params) : "not recorded");
    h += table_row("tokens per step", field(r, "tokens_per_step"));
    h += table_row("FLOPs per token", human(num(r, "flops_per_token")));
    const double peak = num(r, "peak_flops");
    h += table_row("peak FLOP/s per rank", peak > 0 ? human(peak) + "FLOP/s" : "not set (log.peak_flops)");
    h += table_row("simulated bubble", pct(num(r, "simulated_bubble")));
  } else {
    h += table_row("run.json", run_problem.empty() ? "not recorded" : run_problem);
  }
  h += "</table>\n<table>\n<caption>metrics.jsonl</caption>\n";
  if (rows.empty()) {
    h += table_row("steps", "no rows");
  } else {
    const auto loss = column(rows, "loss"), val = column(rows, "val_loss");
    h += table_row("steps recorded", fmt::format("{} (step {} to {})", rows.size(), rows.front()["step"].dump(),
                                                 rows.back()["step"].dump()));
    h += table_row("loss", fmt::format("{:.4f} \u2192 {:.4f}", loss.front(), loss.back()));
    double last_val = kNaN;
    for (double v : val)
      if (std::isfinite(v)) last_val = v;
    h += table_row("last val_loss", std::isfinite(last_val) ? fmt::format("{:.4f}", last_val) : "not recorded");
    h += table_row("tokens/s (median)", human(median(column(rows, "tokens_per_s"))));
    h += table_row("step time (median)", fmt::format("{:.1f} ms", 1e3 * median(column(rows, "step_time_s"))));
    h += table_row("measured bubble (median)", pct(median(column(rows, "bubble_fraction"))));
    const auto mfu = column(rows, "mfu");
    h += table_row("MFU (median)", any_finite(mfu) ? pct(median(mfu)) : "not recorded");
    const double mem = max_of(column(rows, "peak_mem_bytes"));
    h += table_row("peak memory (largest rank)",
                   std::isfinite(mem) ? fmt::format("{:.0f} MiB", mem / 1048576.0) : "not recorded");
  }
  h += "</table>\n</div>\n";
  if (config)
    h += "<details><summary>config.toml</summary>\n<pre>" + xml_escape(*config) + "</pre>\n</details>\n";
  else
    h += note("config.toml not recorded");
  return h + "</section>\n";
}

std::string card(const std::string& svg, const std::string& extra = "") {
  return "<div class=\"card\">\n" + svg + extra + "</div>\n";
}

// Mixture of experts: a per-layer metric (`key`: moe_max_load, each MoE layer's busiest
// expert over the mean; moe_dropped, the share of choices dropped over capacity), per step,
// beside the mean load-balancing loss for the load; none where the metrics lack the key.
std::string expert_card(const std::vector<json>& rows, const std::vector<double>& steps, const char* key,
                        const LinePlot& spec) {
  size_t layers = 0;
  for (const auto& r : rows)
    if (r.contains(key) && r[key].is_array()) layers = std::max(layers, r[key].size());
  if (layers == 0) return "";
  static const char* colors[] = {"#4e79a7", "#f28e2b", "#59a14f", "#e15759",
                                 "#76b7b2", "#b07aa1", "#edc948", "#9c755f"};
  std::vector<PlotSeries> series;
  for (size_t i = 0; i < layers; ++i) {
    std::vector<double> v;
    for (const auto& r : rows) {
      const bool has = r.contains(key) && r[key].is_array() && i < r[key].size();
      v.push_back(has ? r[key][i].get<double>() : kNaN);
    }
    series.push_back({fmt::format("MoE layer {}", i), steps, std::move(v), colors[i % 8]});
  }
  if (std::string(key) == "moe_max_load")
    series.push_back({"load-balancing loss", steps, column(rows, "moe_load_balance_loss"), "#888888", false, true});
  return card(svg_line_plot(spec, series));
}

std::string plots_section(const std::vector<json>& rows, const std::optional<json>& run) {
  std::string h = "<section id=\"curves\">\n<h2>Training curves</h2>\n";
  if (rows.empty()) return h + note("metrics.jsonl has no rows yet") + "</section>\n";
  const auto steps = column(rows, "step"), tokens = column(rows, "tokens");
  const auto loss = column(rows, "loss"), val = column(rows, "val_loss");
  const bool has_val = any_finite(val);
  const std::string val_note = has_val ? "" : note("val_loss not recorded (set data.val and train.eval_every)");
  const PlotSeries loss_s{"loss", steps, loss, "#4e79a7"};
  const PlotSeries val_s{"val_loss", steps, val, "#e15759", true};
  using Series = std::vector<PlotSeries>;

  h += "<div class=\"grid\">\n";
  h += card(svg_line_plot({"Loss vs step", "step", "loss"}, has_val ? Series{loss_s, val_s} : Series{loss_s}),
            val_note);
  PlotSeries loss_t = loss_s, val_t = val_s;
  loss_t.x = val_t.x = tokens;
  h += card(svg_line_plot({"Loss vs tokens", "tokens seen", "loss"}, has_val ? Series{loss_t, val_t} : Series{loss_t}),
            val_note);
  h += card(svg_line_plot({"Throughput vs step", "step", "tokens/s"},
                          {{"tokens/s", steps, column(rows, "tokens_per_s"), "#59a14f"}}));
  h += card(svg_line_plot({"Learning rate vs step", "step", "learning rate"}, {{"lr", steps, column(rows, "lr"), "#f28e2b"}}));
  std::vector<PlotSeries> shares = {{"measured bubble", steps, column(rows, "bubble_fraction", 100), "#b07aa1"}};
  const double sim = run ? num(*run, "simulated_bubble") : kNaN;
  if (std::isfinite(sim)) shares.push_back({"simulated bubble", steps, std::vector<double>(steps.size(), 100 * sim), "#888888", false, true});
  const auto mfu = column(rows, "mfu", 100);
  if (any_finite(mfu)) shares.push_back({"MFU", steps, mfu, "#e15759"});
  h += card(svg_line_plot({"Bubble fraction and MFU vs step", "step", "percent"}, shares),
            any_finite(mfu) ? "" : note("MFU not recorded (set log.peak_flops)"));
  h += card(svg_line_plot({"Gradient norm vs step", "step", "gradient norm (before clipping)"},
                          {{"grad_norm", steps, column(rows, "grad_norm"), "#76b7b2"}}));
  h +=
      expert_card(rows, steps, "moe_max_load", {"Expert load vs step", "step", "busiest expert / mean (1 = balanced)"});
  h += expert_card(rows, steps, "moe_dropped", {"Dropped over capacity vs step", "step", "share of choices dropped"});
  return h + "</div>\n</section>\n";
}

struct Span {
  int rank = 0;
  int64_t step = 0;
  double start = 0, dur = 0;  // microseconds
  std::string name;
  bool wait = false;
};

// Complete ("X") events of a Chrome trace; the rank is `pid` (measured) or `tid` (simulated).
std::vector<Span> trace_spans(const json& doc, const char* rank_key) {
  const json& events = doc.is_object() && doc.contains("traceEvents") ? doc["traceEvents"] : doc;
  std::vector<Span> out;
  if (!events.is_array()) return out;
  for (const auto& e : events) {
    if (!e.is_object() || e.value("ph", "") != "X" || !e.contains(rank_key) || !e[rank_key].is_number_integer())
      continue;
    Span s;
    s.rank = e[rank_key].get<int>();
    s.start = num(e, "ts");
    s.dur = num(e, "dur");
    s.name = e.value("name", "");
    s.wait = s.name.rfind("wait ", 0) == 0 || e.value("cat", "") == "wait";
    if (e.contains("args") && e["args"].is_object() && e["args"].contains("step") && e["args"]["step"].is_number())
      s.step = e["args"]["step"].get<int64_t>();
    if (s.rank >= 0 && s.rank < 4096 && std::isfinite(s.start) && std::isfinite(s.dur)) out.push_back(std::move(s));
  }
  return out;
}

// The op letter of an action name such as "1F3" or "wait 0B12".
char op_of(const std::string& name) {
  size_t i = name.rfind("wait ", 0) == 0 ? 5 : 0;
  while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i]))) ++i;
  return i < name.size() ? name[i] : '?';
}

// Boxes relative to the earliest span, scaled by `scale` (microseconds -> axis units).
std::vector<TimelineBox> boxes_of(const std::vector<Span>& spans, double scale, int& rows) {
  double t0 = std::numeric_limits<double>::infinity();
  for (const auto& s : spans) t0 = std::min(t0, s.start);
  std::vector<TimelineBox> boxes;
  for (const auto& s : spans) {
    boxes.push_back({s.rank, (s.start - t0) * scale, (s.start - t0 + s.dur) * scale, s.name, op_of(s.name), s.wait});
    rows = std::max(rows, s.rank + 1);
  }
  return boxes;
}

std::vector<std::string> rank_labels(int rows) {
  std::vector<std::string> labels;
  for (int r = 0; r < rows; ++r) labels.push_back(fmt::format("rank {}", r));
  return labels;
}

std::string measured_timeline(const fs::path& dir, const std::optional<json>& run, const std::vector<json>& rows) {
  std::string problem;
  const auto doc = read_json(dir / "trace.json", problem);
  std::string h = "<section id=\"timeline-measured\">\n<h2>Pipeline timeline: measured</h2>\n";
  if (!doc) return h + note(problem.empty() ? "trace.json not recorded" : problem) + "</section>\n";
  auto spans = trace_spans(*doc, "pid");
  if (spans.empty()) return h + note("trace.json holds no events") + "</section>\n";
  int64_t step = spans.front().step;
  for (const auto& s : spans) step = std::max(step, s.step);
  std::erase_if(spans, [&](const Span& s) { return s.step != step; });
  int nrows = run ? static_cast<int>(std::max(0.0, num(*run, "world_size"))) : 0;
  const auto boxes = boxes_of(spans, 1e-3, nrows);
  double span_ms = 0;
  for (const auto& b : boxes) span_ms = std::max(span_ms, b.end);
  std::vector<ShareBar> bars(static_cast<size_t>(nrows));
  double compute = 0;
  for (int r = 0; r < nrows; ++r) bars[static_cast<size_t>(r)].label = fmt::format("rank {}", r);
  for (const auto& b : boxes) {
    auto& bar = bars[static_cast<size_t>(b.row)];
    (b.wait ? bar.wait : bar.compute) += b.end - b.start;
    if (!b.wait) compute += b.end - b.start;
  }
  for (auto& bar : bars) bar.idle = std::max(0.0, span_ms - bar.compute - bar.wait);
  double logged = kNaN, step_time = kNaN;
  for (const auto& r : rows)
    if (r["step"].get<int64_t>() == step) logged = num(r, "bubble_fraction"), step_time = num(r, "step_time_s");

  h += "<p>Step " + std::to_string(step) + fmt::format(
           " (the last step in trace.json), shifted to start at 0: {:.1f} ms from the first action to the last",
           span_ms);
  if (std::isfinite(step_time)) h += fmt::format(" (step_time_s {:.1f} ms)", 1e3 * step_time);
  h += fmt::format("; compute fills {} of ranks \u00d7 span, a bubble of {}", pct(compute / (nrows * span_ms)),
                   pct(1 - compute / (nrows * span_ms)));
  if (std::isfinite(logged)) h += " (metrics.jsonl: " + pct(logged) + ")";
  h += ". Hover a box for its times.</p>\n";
  h += svg_timeline({"measured", fmt::format("Measured timeline, step {}", step),
                     "time since the step's first action (ms)", rank_labels(nrows)},
                    boxes);
  h += "<h3>Busy and idle time per rank</h3>\n";
  h += svg_share_bars("shares", fmt::format("Busy / idle per rank, step {}", step), bars);
  return h + "</section>\n";
}

std::string simulated_timeline(const fs::path& dir, const std::optional<json>& run) {
  std::string problem;
  const auto doc = read_json(dir / "schedule_sim.json", problem);
  std::string h = "<section id=\"timeline-simulated\">\n<h2>Pipeline timeline: simulated</h2>\n";
  if (!doc) return h + note(problem.empty() ? "schedule_sim.json not recorded" : problem) + "</section>\n";
  const auto spans = trace_spans(*doc, "tid");
  if (spans.empty()) return h + note("schedule_sim.json holds no events") + "</section>\n";
  int nrows = 0;
  const auto boxes = boxes_of(spans, 1e-3, nrows);  // 1 cost unit = 1 ms = 1000 us
  double makespan = 0, busy = 0;
  for (const auto& b : boxes) makespan = std::max(makespan, b.end), busy += b.end - b.start;
  std::string name = run ? field(*run, "schedule") : "schedule";
  h += fmt::format("<p>The schedule as simulated before the run (schedule_sim.json): makespan {:.4g} units, "
                   "bubble {}. Compare the order of actions with the measured step above; widths differ "
                   "because real F, B, I, W costs differ from the model's.</p>\n",
                   makespan, pct(1 - busy / (nrows * makespan)));
  h += svg_timeline({"simulated", fmt::format("Simulated timeline, {}", name),
                     "simulated time (cost units: F = 1, B = 2)", rank_labels(nrows)},
                    boxes);
  return h + "</section>\n";
}

constexpr const char* kStyle = R"(
body { font-family: Helvetica, Arial, sans-serif; color: #222; margin: 0 auto; padding: 16px 24px;
       max-width: 1260px; background: #fafafa; }
h1 { font-size: 22px; margin: 8px 0 4px; } h2 { font-size: 18px; margin: 28px 0 8px; border-bottom: 1px solid #ddd; }
h3 { font-size: 15px; margin: 16px 0 6px; }
.sub { color: #666; margin: 0 0 12px; }
.tables { display: flex; flex-wrap: wrap; gap: 24px; align-items: flex-start; }
table { border-collapse: collapse; background: #fff; font-size: 14px; }
caption { text-align: left; font-weight: bold; padding: 4px 0; color: #555; }
th, td { border: 1px solid #ddd; padding: 4px 10px; text-align: left; vertical-align: top; }
th { background: #f2f2f2; font-weight: normal; color: #444; }
details { margin-top: 12px; } summary { cursor: pointer; color: #345; }
pre { background: #fff; border: 1px solid #ddd; padding: 8px 12px; font-size: 13px; overflow-x: auto; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(600px, 1fr)); gap: 16px; }
.card { background: #fff; border: 1px solid #e2e2e2; padding: 6px; }
svg { max-width: 100%; height: auto; display: block; }
.note { color: #8a6d3b; font-size: 13px; margin: 4px 6px; }
footer { color: #888; font-size: 12px; margin-top: 32px; }
)";

}  // namespace

std::string render_report(const std::string& run_dir, const std::string& metrics_file) {
  const fs::path dir(run_dir);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail("report: {} is not a run directory (train with log.dir=DIR)", run_dir);
  const fs::path metrics = metrics_file.empty() ? dir / "metrics.jsonl" : fs::path(metrics_file);
  if (!fs::exists(metrics, ec))
    fail("report: no metrics file {} (the run's metrics.jsonl; with log.metrics, pass --metrics FILE)",
         metrics.string());
  const auto rows = load_metrics(metrics);
  std::string run_problem;
  const auto run = read_json(dir / "run.json", run_problem);
  const auto config = read_text(dir / "config.toml");

  std::string name = fs::absolute(dir, ec).lexically_normal().string();
  while (name.size() > 1 && name.back() == '/') name.pop_back();
  std::string h = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  h += "<title>pipetrain report: " + xml_escape(name) + "</title>\n<style>" + kStyle + "</style>\n</head>\n<body>\n";
  h += "<h1>pipetrain report</h1>\n<p class=\"sub\">" + xml_escape(name) + "</p>\n";
  h += header_section(run, run_problem, config, rows);
  h += plots_section(rows, run);
  h += measured_timeline(dir, run, rows);
  h += simulated_timeline(dir, run);
  h += "<footer>Generated by pipetrain " PIPETRAIN_VERSION " report from " + xml_escape(name) + ".</footer>\n";
  return h + "</body>\n</html>\n";
}

}  // namespace pipetrain
