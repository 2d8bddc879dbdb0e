// Small inline-SVG charts for `pipetrain report` (no scripts, no external resources).
// Exports: xml_escape, nice_ticks, format_tick, PlotSeries, LinePlot, svg_line_plot,
// TimelineBox, Timeline, svg_timeline, svg_schedule, op_color, ShareBar, svg_share_bars.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "pipetrain/schedule/simulate.hpp"

namespace pipetrain {

// Escapes & < > " ' for HTML/SVG text and attribute values.
std::string xml_escape(std::string_view text);

// About `target` evenly spaced "nice" values (1, 2, 2.5 or 5 times a power of ten)
// covering [lo, hi]; the first is <= lo and the last >= hi.
std::vector<double> nice_ticks(double lo, double hi, int target = 5);

// A tick label: as many decimals as the tick step needs; a K/M/G/T suffix when the
// step is at least 10^3, 10^6, ... (so that one axis uses one unit).
std::string format_tick(double value, double step);

struct PlotSeries {
  std::string name;
  std::vector<double> x, y;  // same length; non-finite points are skipped
  std::string color = "#4e79a7";
  bool markers = false;  // a dot on every point (always drawn for a lone point)
  bool dashed = false;
};

struct LinePlot {
  std::string title, x_label, y_label;
  int width = 600, height = 320;
  std::string empty_note = "no data";  // shown when no series has a finite point
};

// An SVG line chart: title, legend, axes with tick labels and grid lines, one polyline
// per series.
std::string svg_line_plot(const LinePlot& plot, const std::vector<PlotSeries>& series);

// One rectangle of a timeline: `row` (rank), [start, end) in the timeline's units,
// `op` one of F B I W (anything else is drawn grey), `wait` drawn hatched.
struct TimelineBox {
  int row = 0;
  double start = 0, end = 0;
  std::string label;
  char op = '?';
  bool wait = false;
};

struct Timeline {
  std::string id;  // unique within the page (prefixes the hatch pattern's id)
  std::string title, x_label;
  std::vector<std::string> row_labels;  // one row each, top to bottom
  int width = 1200;
};

// One row per rank, one rectangle per box (labelled with its name when wide enough, a
// tooltip always), a legend and a time axis starting at 0.
std::string svg_timeline(const Timeline& t, const std::vector<TimelineBox>& boxes);

// A simulated schedule as a timeline (`pipetrain schedule --svg`): one row per rank, one
// box per action, titled with the makespan and bubble; wide enough that the shortest
// action is ~40 px (1200 to 6000 px).
std::string svg_schedule(const Schedule& s, const SimResult& r);

// Fill colour of an op: F blue, B green, I orange, W purple, else grey.
const char* op_color(char op);

// One horizontal 100% bar per row, split into compute / wait / untracked idle.
struct ShareBar {
  std::string label;
  double compute = 0, wait = 0, idle = 0;  // durations (any unit)
};
std::string svg_share_bars(const std::string& id, const std::string& title, const std::vector<ShareBar>& bars,
                           int width = 1200);

}  // namespace pipetrain
