// Renderers: the text grid and the Chrome-trace JSON (the SVG timeline: test_report.cpp).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "pipetrain/schedule/registry.hpp"
#include "pipetrain/schedule/render.hpp"
#include "pipetrain/schedule/simulate.hpp"

namespace pipetrain {
namespace {

TEST(ScheduleRender, TextGrid) {
  const Schedule s = make_schedule("1f1b", {2, 1, 2});
  const std::string grid = render_text(s, simulate(s));
  EXPECT_EQ(grid,
            "time   0                   5\n"
            "rank 0 0F0 0F1   .   . 0B0 ---   . 0B1 ---\n"
            "rank 1   . 1F0 1B0 --- 1F1 1B1 ---   .   .\n");
}

TEST(ScheduleRender, TextGridWithUnevenCosts) {
  const Schedule s = make_schedule("zb-h1", {1, 1, 1});
  Costs c;
  c.F = 1;
  c.I = 2;
  c.W = 0.5;
  const std::string grid = render_text(s, simulate(s, c));
  // Slot = 0.5: F takes 2 slots, I 4, W 1.
  EXPECT_EQ(grid, "time   0                   2.5\nrank 0 0F0 --- 0I0 --- --- --- 0W0\n");
}

TEST(ScheduleRender, ChromeTraceParses) {
  const Schedule s = make_schedule("1f1b", {3, 1, 4});
  const auto r = simulate(s);
  const auto doc = nlohmann::json::parse(render_chrome_trace(s, r));
  const auto& ev = doc.at("traceEvents");
  size_t complete = 0;
  for (const auto& e : ev) {
    if (e.at("ph") != "X") continue;
    ++complete;
    EXPECT_EQ(e.at("pid"), 0);
    EXPECT_GE(e.at("tid").get<int>(), 0);
    EXPECT_LT(e.at("tid").get<int>(), 3);
    EXPECT_GT(e.at("dur").get<double>(), 0);
  }
  EXPECT_EQ(complete, r.events.size());
  const auto& first = ev.at(ev.size() - r.events.size());
  EXPECT_EQ(first.at("name"), "0F0");
  EXPECT_EQ(first.at("ts").get<double>(), 0.0);
  EXPECT_EQ(first.at("dur").get<double>(), 1000.0);
}

}  // namespace
}  // namespace pipetrain
