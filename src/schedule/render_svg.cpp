// render_svg() of pipetrain/schedule/render.hpp: an SVG timeline, one row per rank.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "pipetrain/schedule/render.hpp"

namespace pipetrain {
namespace {

const char* fill_of(Op op) {
  switch (op) {
    case Op::F: return "#4e79a7";
    case Op::B: return "#59a14f";
    case Op::I: return "#f28e2b";
    case Op::W: return "#b07aa1";
  }
  return "#999999";
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// A round tick step giving about 10 ticks over `span`.
double tick_step(double span) {
  if (span <= 0) return 1;
  const double raw = span / 10, mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double f : {1.0, 2.0, 5.0, 10.0})
    if (raw <= f * mag) return f * mag;
  return 10 * mag;
}

}  // namespace

std::string render_svg(const Schedule& s, const SimResult& r) {
  double unit = 0;
  for (const auto& e : r.events) {
    const double d = e.end - e.start;
    if (d > 0 && (unit == 0 || d < unit)) unit = d;
  }
  if (unit == 0) unit = 1;
  // Pixels per time unit: the shortest action 40 px wide, the whole chart at most ~6000 px.
  double px = 40.0 / unit;
  if (r.makespan > 0) px = std::min(px, 6000.0 / r.makespan);
  const double left = 70, top = 40, row = 28, bar = 22;
  const double width = std::max(left + r.makespan * px + 20, 480.0);
  const double height = top + s.num_ranks * row + 40;
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" "
      "font-family=\"monospace\" font-size=\"11\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{}\" y=\"20\" font-size=\"14\">{}: makespan {:g}, bubble {:.1f}%</text>\n",
      width, height, left, escape(s.name.empty() ? "schedule" : s.name), r.makespan,
      100 * r.bubble_fraction);
  double lx = width - 20;
  for (Op op : {Op::W, Op::I, Op::B, Op::F}) {  // legend, right-aligned
    lx -= 34;
    out += fmt::format("<rect x=\"{:.1f}\" y=\"9\" width=\"12\" height=\"12\" fill=\"{}\"/>"
                       "<text x=\"{:.1f}\" y=\"19\">{}</text>\n",
                       lx, fill_of(op), lx + 15, op_char(op));
  }
  for (int rank = 0; rank < s.num_ranks; ++rank)
    out += fmt::format("<text x=\"8\" y=\"{:.1f}\">rank {}</text>\n",
                       top + rank * row + bar / 2 + 4, rank);
  for (const auto& e : r.events) {
    const double x = left + e.start * px, w = (e.end - e.start) * px;
    const double y = top + e.rank * row;
    const std::string label = to_string(e.action);
    out += fmt::format(
        "<g><title>{} rank {} [{:g}, {:g}]</title><rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" "
        "height=\"{}\" fill=\"{}\" stroke=\"white\" stroke-width=\"1\"/>",
        label, e.rank, e.start, e.end, x, y, w, bar, fill_of(e.action.op));
    if (w >= 7.0 * static_cast<double>(label.size()))
      out += fmt::format("<text x=\"{:.2f}\" y=\"{:.1f}\" fill=\"white\" text-anchor=\"middle\">{}</text>",
                         x + w / 2, y + bar / 2 + 4, label);
    out += "</g>\n";
  }
  const double axis_y = top + s.num_ranks * row + 6;
  out += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{:.2f}\" y2=\"{:.1f}\" stroke=\"black\"/>\n",
                     left, axis_y, left + r.makespan * px, axis_y);
  const double step = tick_step(r.makespan);
  for (double t = 0; t <= r.makespan + 1e-9; t += step)
    out += fmt::format(
        "<line x1=\"{0:.2f}\" y1=\"{1:.1f}\" x2=\"{0:.2f}\" y2=\"{2:.1f}\" stroke=\"black\"/>"
        "<text x=\"{0:.2f}\" y=\"{3:.1f}\" text-anchor=\"middle\">{4:g}</text>\n",
        left + t * px, axis_y, axis_y + 5, axis_y + 18, t);
  out += "</svg>\n";
  return out;
}

}  // namespace pipetrain
