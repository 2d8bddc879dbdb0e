// `pipetrain report`: the HTML page of a synthetic run directory, its graceful
// degradation when optional files are missing, its errors, and the SVG helpers.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "pipetrain/app/report.hpp"
#include "pipetrain/app/svg_plot.hpp"
#include "pipetrain/core/error.hpp"
#include "pipetrain/schedule/registry.hpp"
#include "pipetrain/schedule/render.hpp"
#include "pipetrain/schedule/simulate.hpp"

namespace pipetrain {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

size_t count(const std::string& s, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = s.find(needle); pos != std::string::npos; pos = s.find(needle, pos + 1)) ++n;
  return n;
}

// The text of the <section id="ID"> of a page.
std::string section(const std::string& html, const std::string& id) {
  const size_t a = html.find("<section id=\"" + id + "\">");
  if (a == std::string::npos) return "";
  return html.substr(a, html.find("</section>", a) - a);
}

class ReportRender : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    dir_ = fs::temp_directory_path() / fmt::format("pipetrain_report_{}_{}", ::getpid(), counter++);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  void write(const std::string& name, const std::string& text) const { std::ofstream(dir_ / name) << text; }

  // Five steps (step 3 logged twice, as by a resumed run; a torn last line), val_loss on
  // steps 2 and 4 when `val`, mfu when `mfu`.
  void write_metrics(bool val, bool mfu) const {
    std::string text;
    for (int step : {0, 1, 2, 3, 3, 4}) {
      json row = {{"step", step},          {"loss", 5.5 - 0.5 * step},     {"lr", 1e-4 * (step + 1)},
                  {"grad_norm", 2.0},      {"tokens_per_s", 15000 + 100 * step}, {"step_time_s", 0.12},
                  {"bubble_fraction", 0.25}, {"tokens", 2048 * (step + 1)}, {"flops_per_s", 8e10},
                  {"peak_mem_bytes", 6e7}};
      if (val && step % 2 == 0 && step > 0) row["val_loss"] = 5.0 - 0.4 * step;
      if (mfu) row["mfu"] = 0.4;
      text += row.dump() + "\n";
    }
    write("metrics.jsonl", text + "{\"step\": 5, \"lo");
  }

  // Three pipeline ranks: run.json, config.toml, the simulated 1f1b schedule and a
  // measured trace of steps 0 and 1 (1F/1B per microbatch and stage, waits between).
  void write_full_run() const {
    write_metrics(true, true);
    write("run.json", json{{"config", "demo.toml"},
                           {"grid", {{"dp", 1}, {"pp", 3}, {"tp", 1}}},
                           {"world_size", 3},
                           {"schedule", "1f1b"},
                           {"num_stages", 3},
                           {"microbatches", 4},
                           {"model_params", 842496},
                           {"tokens_per_step", 2048},
                           {"flops_per_token", 5.4e6},
                           {"peak_flops", 1e11},
                           {"simulated_bubble", 1.0 / 3}}
                          .dump(2));
    write("config.toml", "[model]\nn_layer = 4\n# <script>alert(1)</script> & more\n");
    const Schedule s = make_schedule("1f1b", {3, 1, 4});
    write("schedule_sim.json", render_chrome_trace(s, simulate(s)));
    json events = json::array();
    for (int step = 0; step < 2; ++step)
      for (int rank = 0; rank < 3; ++rank) {
        events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", rank}});
        double t = step * 1e5 + rank * 1000.0;
        if (rank > 0) events.push_back(event(fmt::format("wait {}F0", rank), rank, step, t - rank * 1000.0, rank * 1000.0));
        for (int m = 0; m < 4; ++m) {
          events.push_back(event(fmt::format("{}F{}", rank, m), rank, step, t, 2000)), t += 2000;
          events.push_back(event(fmt::format("{}B{}", rank, m), rank, step, t, 4000)), t += 4000;
        }
      }
    write("trace.json", json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump());
  }

  static json event(const std::string& name, int rank, int step, double ts, double dur) {
    const bool wait = name.rfind("wait ", 0) == 0;
    return {{"name", name}, {"cat", wait ? "wait" : "compute"}, {"ph", "X"}, {"pid", rank}, {"tid", 0},
            {"ts", ts},     {"dur", dur},                        {"args", {{"step", step}}}};
  }

  fs::path dir_;
};

TEST_F(ReportRender, FullRunDirectory) {
  write_full_run();
  const std::string html = render_report(dir_.string());
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("</html>"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);  // the config's text is escaped
  EXPECT_NE(html.find("&lt;script&gt;alert(1)&lt;/script&gt; &amp; more"), std::string::npos);
  EXPECT_NE(html.find("<details><summary>config.toml</summary>"), std::string::npos);
  for (const char* title : {"Loss vs step", "Loss vs tokens", "Throughput vs step", "Learning rate vs step",
                            "Bubble fraction and MFU vs step", "Gradient norm vs step"})
    EXPECT_NE(html.find(std::string(">") + title + "</text>"), std::string::npos) << title;
  EXPECT_EQ(count(html, "<svg"), 6u + 3u);  // six plots, two timelines, the busy/idle bars
  EXPECT_EQ(count(html, "<svg class=\"plot\""), 6u);
  // Header: run.json and the metrics summary (5 distinct steps, the torn line dropped).
  EXPECT_NE(html.find("dp 1 \u00d7 pp 3 \u00d7 tp 1 = 3 ranks"), std::string::npos);
  EXPECT_NE(html.find("1f1b: 3 stages, 4 microbatches"), std::string::npos);
  EXPECT_NE(html.find("842.50K (842496)"), std::string::npos);
  EXPECT_NE(html.find("<td>33.3%</td>"), std::string::npos);
  EXPECT_NE(html.find("5 (step 0 to 4)"), std::string::npos);
  EXPECT_EQ(html.find("not recorded"), std::string::npos);
  EXPECT_NE(html.find(">val_loss</text>"), std::string::npos);
  EXPECT_NE(html.find(">MFU</text>"), std::string::npos);

  // Measured: the last step (1) of the trace, one row per rank, ops and waits, 1F/1B labels.
  const std::string measured = section(html, "timeline-measured");
  ASSERT_FALSE(measured.empty());
  EXPECT_NE(measured.find("Measured timeline, step 1"), std::string::npos);
  const std::string timeline = measured.substr(0, measured.find("<svg class=\"bars\""));
  EXPECT_EQ(count(timeline, "class=\"rank\""), 3u);
  EXPECT_EQ(count(timeline, "<rect class=\"op\""), 3u * 8u);
  EXPECT_EQ(count(timeline, "<rect class=\"wait\""), 2u);
  EXPECT_NE(timeline.find(">1B3</text>"), std::string::npos);
  EXPECT_NE(timeline.find("fill=\"#4e79a7\""), std::string::npos);  // F blue
  EXPECT_NE(timeline.find("fill=\"#59a14f\""), std::string::npos);  // B green
  const std::string bars = measured.substr(measured.find("<svg class=\"bars\""));
  EXPECT_EQ(count(bars, "class=\"rank\""), 3u);
  EXPECT_NE(bars.find("compute 92.3% &#183; wait 0.0% &#183; untracked 7.7%"), std::string::npos);  // rank 0
  // Simulated: 3 pipeline ranks, one box per action.
  const std::string sim = section(html, "timeline-simulated");
  EXPECT_EQ(count(sim, "class=\"rank\""), 3u);
  EXPECT_EQ(count(sim, "<rect class=\"op\""), 3u * 8u);
  EXPECT_NE(sim.find("Simulated timeline, 1f1b"), std::string::npos);
}

TEST_F(ReportRender, OnlyMetricsDegradesGracefully) {
  write_metrics(false, false);
  const std::string html = render_report(dir_.string());
  EXPECT_NE(html.find("val_loss not recorded"), std::string::npos);
  EXPECT_NE(html.find("MFU not recorded"), std::string::npos);
  EXPECT_NE(html.find("trace.json not recorded"), std::string::npos);
  EXPECT_NE(html.find("schedule_sim.json not recorded"), std::string::npos);
  EXPECT_NE(html.find("config.toml not recorded"), std::string::npos);
  EXPECT_NE(html.find("<th>run.json</th><td>not recorded</td>"), std::string::npos);
  EXPECT_EQ(count(html, "<svg class=\"plot\""), 6u);
  EXPECT_EQ(count(html, "<svg class=\"timeline\""), 0u);
  EXPECT_EQ(html.find(">val_loss</text>"), std::string::npos);
}

// A mixture-of-experts run's metrics: one line per MoE layer in an expert-load plot, the
// dense runs above have none.
TEST_F(ReportRender, ExpertLoadPlotHasALinePerMixtureLayer) {
  std::string text;
  for (int step : {0, 1, 2})
    text += json{{"step", step},
                 {"loss", 5.0},
                 {"tokens", 100 * (step + 1)},
                 {"moe_load_balance_loss", 1.1},
                 {"moe_max_load", {3.0 - step, 2.0, 1.5}}}
                .dump() +
            "\n";
  write("metrics.jsonl", text);
  const std::string html = render_report(dir_.string());
  EXPECT_NE(html.find(">Expert load vs step</text>"), std::string::npos);
  for (const char* line : {">MoE layer 0</text>", ">MoE layer 2</text>", ">load-balancing loss</text>"})
    EXPECT_NE(html.find(line), std::string::npos) << line;
  EXPECT_EQ(html.find(">MoE layer 3</text>"), std::string::npos);
}

TEST_F(ReportRender, CorruptTraceIsANoteAndOtherMetricsFileIsRead) {
  write_metrics(true, true);
  fs::rename(dir_ / "metrics.jsonl", dir_ / "elsewhere.jsonl");
  write("trace.json", "{\"traceEvents\": [");
  const std::string html = render_report(dir_.string(), (dir_ / "elsewhere.jsonl").string());
  EXPECT_NE(html.find("trace.json could not be parsed"), std::string::npos);
  EXPECT_NE(html.find("5 (step 0 to 4)"), std::string::npos);
}

TEST_F(ReportRender, MissingMetricsNamesThePath) {
  const std::string path = (dir_ / "metrics.jsonl").string();
  try {
    render_report(dir_.string());
    FAIL() << "expected pipetrain::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

TEST_F(ReportRender, MissingRunDirNamesThePath) {
  const std::string path = (dir_ / "no-such-run").string();
  try {
    render_report(path);
    FAIL() << "expected pipetrain::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

TEST_F(ReportRender, BadMetricsLineNamesTheLine) {
  write("metrics.jsonl", "{\"step\": 0, \"loss\": 5}\nnot json\n{\"step\": 1, \"loss\": 4}\n");
  try {
    render_report(dir_.string());
    FAIL() << "expected pipetrain::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("metrics.jsonl line 2"), std::string::npos) << e.what();
  }
}

TEST(ReportSvg, ScheduleTimelineHasOneBoxPerAction) {
  const Schedule s = make_schedule("zbv", {2, 2, 4});
  const auto r = simulate(s);
  const std::string svg = svg_schedule(s, r);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  size_t boxes = 0;
  for (size_t at = svg.find("class=\"op\""); at != std::string::npos; at = svg.find("class=\"op\"", at + 1)) ++boxes;
  EXPECT_EQ(boxes, r.events.size());
  EXPECT_NE(svg.find(">0F0<"), std::string::npos);
  EXPECT_NE(svg.find(">rank 1<"), std::string::npos);
  EXPECT_NE(svg.find("zbv: makespan"), std::string::npos);
}

TEST(ReportSvg, NiceTicksAndLabels) {
  EXPECT_EQ(nice_ticks(0, 29, 6), (std::vector<double>{0, 5, 10, 15, 20, 25, 30}));
  EXPECT_EQ(nice_ticks(2.87, 5.54, 5), (std::vector<double>{2, 3, 4, 5, 6}));
  EXPECT_EQ(nice_ticks(0, 0.002, 4), (std::vector<double>{0, 0.0005, 0.001, 0.0015, 0.002}));
  const auto flat = nice_ticks(3, 3, 5);
  ASSERT_GE(flat.size(), 2u);
  EXPECT_LE(flat.front(), 3);
  EXPECT_GE(flat.back(), 3);
  EXPECT_EQ(format_tick(20000, 2500), "20.0K");
  EXPECT_EQ(format_tick(7500, 2500), "7.5K");
  EXPECT_EQ(format_tick(0, 2500), "0");
  EXPECT_EQ(format_tick(60000, 10000), "60K");
  EXPECT_EQ(format_tick(0.0015, 0.0005), "0.0015");
  EXPECT_EQ(format_tick(2.5, 0.5), "2.5");
  EXPECT_EQ(format_tick(125, 25), "125");
  EXPECT_EQ(format_tick(3e9, 1e9), "3G");
  EXPECT_EQ(format_tick(0.001, 0.00002), "0.00100");
  EXPECT_EQ(xml_escape("a<b & \"c\" 'd'>"), "a&lt;b &amp; &quot;c&quot; &#39;d&#39;&gt;");
}

TEST(ReportSvg, LinePlotDrawsSeriesAndLegend) {
  const std::string svg = svg_line_plot({"Demo <plot>", "step", "value"},
                                        {{"a", {0, 1, 2}, {1, 2, 3}}, {"b", {1}, {2.5}, "#e15759", true}});
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_EQ(count(svg, "<polyline"), 1u);
  EXPECT_EQ(count(svg, "<circle"), 1u);
  EXPECT_NE(svg.find(">Demo &lt;plot&gt;</text>"), std::string::npos);
  EXPECT_EQ(count(svg, "class=\"legend\""), 2u);
  const std::string empty = svg_line_plot({"Nothing", "x", "y"}, {{"a", {0}, {std::nan("")}}});
  EXPECT_NE(empty.find(">no data</text>"), std::string::npos);
  EXPECT_EQ(count(empty, "<polyline"), 0u);
}

}  // namespace
}  // namespace pipetrain
