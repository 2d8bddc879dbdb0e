// The inline-SVG charts of pipetrain/app/svg_plot.hpp.
#include "pipetrain/app/svg_plot.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace pipetrain {

namespace {

constexpr const char* kFont = "font-family=\"Helvetica, Arial, sans-serif\"";
constexpr double kCharWidth = 6.6;  // rough width of one 11 px character

// Numbers in SVG attributes: short, fixed, locale-free.
std::string num(double v) { return fmt::format("{:.1f}", v); }

bool finite(double v) { return std::isfinite(v); }

// [lo, hi] widened when empty so that a scale can divide by its length.
void widen(double& lo, double& hi) {
  if (hi > lo) return;
  const double pad = lo == 0 ? 1.0 : std::abs(lo) * 0.05;
  lo -= pad;
  hi += pad;
}

std::string svg_open(const std::string& cls, int width, int height) {
  return fmt::format(
      "<svg class=\"{}\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
      "viewBox=\"0 0 {} {}\" {} font-size=\"11\">\n<rect width=\"{}\" height=\"{}\" fill=\"#ffffff\"/>\n",
      cls, width, height, width, height, kFont, width, height);
}

std::string title_text(const std::string& title, double x) {
  return fmt::format("<text class=\"title\" x=\"{}\" y=\"18\" font-size=\"14\" font-weight=\"bold\">{}</text>\n",
                     num(x), xml_escape(title));
}

// Keeps at most two points (the lowest and the highest) per pixel column, in order, so
// that a plot of a very long run stays small but keeps its envelope.
std::vector<std::pair<double, double>> decimate(const std::vector<std::pair<double, double>>& pts) {
  if (pts.size() < 2000) return pts;
  std::vector<std::pair<double, double>> out;
  size_t i = 0;
  while (i < pts.size()) {
    const double col = std::floor(pts[i].first);
    size_t lo = i, hi = i, j = i;
    for (; j < pts.size() && std::floor(pts[j].first) == col; ++j) {
      if (pts[j].second < pts[lo].second) lo = j;
      if (pts[j].second > pts[hi].second) hi = j;
    }
    out.push_back(pts[std::min(lo, hi)]);
    if (lo != hi) out.push_back(pts[std::max(lo, hi)]);
    i = j;
  }
  return out;
}

}  // namespace

std::string xml_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::vector<double> nice_ticks(double lo, double hi, int target) {
  if (!finite(lo) || !finite(hi)) return {};
  widen(lo, hi);
  const double raw = (hi - lo) / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  const double step = (norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 2.5 ? 2.5 : norm <= 5 ? 5 : 10) * mag;
  const double first = std::floor(lo / step + 1e-9), last = std::ceil(hi / step - 1e-9);
  std::vector<double> ticks;
  for (double k = first; k <= last + 0.5; k += 1) ticks.push_back(std::abs(k) < 1e-12 ? 0.0 : k * step);
  return ticks;
}

std::string format_tick(double value, double step) {
  step = std::abs(step);
  if (!(step > 0)) step = std::max(std::abs(value), 1.0);
  if (std::abs(value) < step * 1e-9) value = 0;
  static const std::pair<double, const char*> units[] = {{1e12, "T"}, {1e9, "G"}, {1e6, "M"}, {1e3, "K"}};
  double unit = 1;
  const char* suffix = "";
  for (const auto& [u, s] : units)  // by the step, so that one axis uses one unit
    if (step >= u) {
      unit = u;
      suffix = s;
      break;
    }
  if (value == 0) return "0";
  const double scaled = step / unit;
  if (scaled < 1e-6) return fmt::format("{:.3g}", value);
  int decimals = 0;
  while (decimals < 8) {
    const double v = scaled * std::pow(10.0, decimals);
    if (std::abs(v - std::round(v)) < 1e-6 * v) break;
    ++decimals;
  }
  return fmt::format("{:.{}f}{}", value / unit, decimals, suffix);
}

const char* op_color(char op) {
  switch (op) {
    case 'F': return "#4e79a7";
    case 'B': return "#59a14f";
    case 'I': return "#f28e2b";
    case 'W': return "#b07aa1";
    case 'V': return "#e15759";  // a vocabulary slice
    default: return "#9d9d9d";
  }
}

std::string svg_line_plot(const LinePlot& plot, const std::vector<PlotSeries>& series) {
  const double L = 68, R = 16, T = 50, B = 44;
  const double W = plot.width, H = plot.height;
  std::string svg = svg_open("plot", plot.width, plot.height) + title_text(plot.title, L);

  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const auto& s : series)
    for (size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i)
      if (finite(s.x[i]) && finite(s.y[i])) {
        x0 = std::min(x0, s.x[i]), x1 = std::max(x1, s.x[i]);
        y0 = std::min(y0, s.y[i]), y1 = std::max(y1, s.y[i]);
      }
  if (!finite(x0)) {
    svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#bbb\"/>\n", L, T,
                       W - L - R, H - T - B);
    svg += fmt::format("<text class=\"note\" x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"#777\">{}</text>\n",
                       num((L + W - R) / 2), num((T + H - B) / 2), xml_escape(plot.empty_note));
    return svg + "</svg>\n";
  }
  widen(x0, x1);
  widen(y0, y1);
  const auto xt = nice_ticks(x0, x1, 6), yt = nice_ticks(y0, y1, 5);
  // x spans the data exactly (steps start at the first one); y spans the nice ticks.
  const double ylo = yt.front(), yhi = yt.back();
  auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double y) { return H - B - (y - ylo) / (yhi - ylo) * (H - T - B); };

  // Grid, ticks and their labels.
  const double ystep = yt.size() > 1 ? yt[1] - yt[0] : 1, xstep = xt.size() > 1 ? xt[1] - xt[0] : 1;
  for (double y : yt)
    svg += fmt::format(
        "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#e6e6e6\"/>"
        "<text x=\"{}\" y=\"{}\" text-anchor=\"end\" fill=\"#444\">{}</text>\n",
        L, num(py(y)), W - R, num(py(y)), L - 6, num(py(y) + 4), format_tick(y, ystep));
  for (double x : xt) {
    if (x < x0 - 1e-9 * std::abs(xstep) || x > x1 + 1e-9 * std::abs(xstep)) continue;
    svg += fmt::format(
        "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#e6e6e6\"/>"
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"#444\">{}</text>\n",
        num(px(x)), T, num(px(x)), H - B + 4, num(px(x)), H - B + 16, format_tick(x, xstep));
  }
  svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#888\"/>\n", L, T,
                     W - L - R, H - T - B);
  svg += fmt::format("<text class=\"axis-label\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                     num((L + W - R) / 2), H - 8, xml_escape(plot.x_label));
  svg += fmt::format(
      "<text class=\"axis-label\" transform=\"translate(14,{}) rotate(-90)\" text-anchor=\"middle\">{}</text>\n",
      num((T + H - B) / 2), xml_escape(plot.y_label));

  // Series, then the legend (one entry per series that has points).
  double lx = L;
  for (const auto& s : series) {
    std::vector<std::pair<double, double>> pts;
    for (size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i)
      if (finite(s.x[i]) && finite(s.y[i])) pts.emplace_back(px(s.x[i]), py(s.y[i]));
    if (pts.empty()) continue;
    const std::string color = xml_escape(s.color);
    if (pts.size() > 1) {
      std::string points;
      for (const auto& [x, y] : decimate(pts)) points += num(x) + "," + num(y) + " ";
      points.pop_back();
      svg += fmt::format("<polyline class=\"series\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.8\"{} points=\"{}\"/>\n",
                         color, s.dashed ? " stroke-dasharray=\"6 4\"" : "", points);
    }
    if (s.markers || pts.size() == 1)
      for (const auto& [x, y] : pts)
        svg += fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"3\" fill=\"{}\"/>\n", num(x), num(y), color);
    svg += fmt::format(
        "<line x1=\"{}\" y1=\"36\" x2=\"{}\" y2=\"36\" stroke=\"{}\" stroke-width=\"2.5\"{}/>"
        "<text class=\"legend\" x=\"{}\" y=\"40\">{}</text>\n",
        num(lx), num(lx + 18), color, s.dashed ? " stroke-dasharray=\"5 3\"" : "", num(lx + 22), xml_escape(s.name));
    lx += 22 + kCharWidth * static_cast<double>(s.name.size()) + 16;
  }
  return svg + "</svg>\n";
}

std::string svg_timeline(const Timeline& t, const std::vector<TimelineBox>& boxes) {
  const double L = 96, R = 16, T = 52, B = 40, row_h = 26, gap = 6;
  const double rows = static_cast<double>(t.row_labels.size());
  const double W = t.width, H = T + rows * (row_h + gap) + B;
  std::string svg = svg_open("timeline", t.width, static_cast<int>(H)) + title_text(t.title, L);
  const std::string hatch = xml_escape(t.id) + "-hatch";
  svg += fmt::format(
      "<defs><pattern id=\"{}\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
      "patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#efefef\"/>"
      "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#a8a8a8\" stroke-width=\"2\"/></pattern></defs>\n",
      hatch);
  // Legend: the four ops and waits.
  double lx = L;
  for (const char* op : {"F", "B", "I", "W"}) {
    svg += fmt::format(
        "<rect x=\"{}\" y=\"28\" width=\"14\" height=\"12\" fill=\"{}\"/><text class=\"legend\" x=\"{}\" "
        "y=\"38\">{}</text>\n",
        num(lx), op_color(op[0]), num(lx + 18), op);
    lx += 42;
  }
  svg += fmt::format(
      "<rect x=\"{}\" y=\"28\" width=\"14\" height=\"12\" fill=\"url(#{})\" stroke=\"#999\"/>"
      "<text class=\"legend\" x=\"{}\" y=\"38\">wait</text>"
      "<rect x=\"{}\" y=\"28\" width=\"14\" height=\"12\" fill=\"#f7f7f7\" stroke=\"#999\"/>"
      "<text class=\"legend\" x=\"{}\" y=\"38\">idle</text>\n",
      num(lx), hatch, num(lx + 18), num(lx + 60), num(lx + 78));

  double end = 0;
  for (const auto& b : boxes)
    if (finite(b.end)) end = std::max(end, b.end);
  if (!(end > 0)) end = 1;
  auto px = [&](double x) { return L + x / end * (W - L - R); };
  const double plot_bottom = T + rows * (row_h + gap);

  const auto ticks = nice_ticks(0, end, 10);
  const double step = ticks.size() > 1 ? ticks[1] - ticks[0] : end;
  for (double x : ticks) {
    if (x > end * (1 + 1e-9)) continue;
    svg += fmt::format(
        "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#e6e6e6\"/>"
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"#444\">{}</text>\n",
        num(px(x)), T - 4, num(px(x)), plot_bottom + 4, num(px(x)), plot_bottom + 16, format_tick(x, step));
  }
  for (size_t r = 0; r < t.row_labels.size(); ++r) {
    const double y = T + static_cast<double>(r) * (row_h + gap);
    svg += fmt::format(
        "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#f7f7f7\"/>"
        "<text class=\"rank\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n",
        L, num(y), W - L - R, row_h, L - 8, num(y + row_h / 2 + 4), xml_escape(t.row_labels[r]));
  }
  for (const auto& b : boxes) {
    if (b.row < 0 || b.row >= static_cast<int>(rows) || !finite(b.start) || !finite(b.end)) continue;
    const double x = px(std::max(0.0, b.start)), w = std::max(0.6, px(b.end) - x);
    const double y = T + b.row * (row_h + gap);
    const std::string fill = b.wait ? fmt::format("url(#{})", hatch) : op_color(b.op);
    svg += fmt::format("<g><title>{}</title><rect class=\"{}\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"{}/>",
                       xml_escape(b.label + fmt::format(": {:.4g} to {:.4g}", b.start, b.end)),
                       b.wait ? "wait" : "op", num(x), num(y), num(w), row_h, fill,
                       b.wait ? "" : " stroke=\"#ffffff\" stroke-width=\"0.5\"");
    if (w >= kCharWidth * static_cast<double>(b.label.size()) + 4)
      svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"{}\">{}</text>", num(x + w / 2),
                         num(y + row_h / 2 + 4), b.wait ? "#444" : "#ffffff", xml_escape(b.label));
    svg += "</g>\n";
  }
  svg += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#888\"/>\n", L, plot_bottom, W - R,
                     plot_bottom);
  svg += fmt::format("<text class=\"axis-label\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                     num((L + W - R) / 2), H - 6, xml_escape(t.x_label));
  return svg + "</svg>\n";
}

std::string svg_share_bars(const std::string& id, const std::string& title, const std::vector<ShareBar>& bars,
                           int width) {
  const double L = 96, R = 300, T = 52, row_h = 20, gap = 8, B = 12;
  const double W = width, H = T + static_cast<double>(bars.size()) * (row_h + gap) + B;
  std::string svg = svg_open("bars", width, static_cast<int>(H)) + title_text(title, L);
  const std::string hatch = xml_escape(id) + "-hatch";
  svg += fmt::format(
      "<defs><pattern id=\"{}\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
      "patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#efefef\"/>"
      "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#a8a8a8\" stroke-width=\"2\"/></pattern></defs>\n",
      hatch);
  const std::string fills[3] = {"#4e79a7", fmt::format("url(#{})", hatch), "#dddddd"};
  const char* names[3] = {"compute", "wait (blocked on a peer)", "untracked (outside any action)"};
  double lx = L;
  for (int k = 0; k < 3; ++k) {
    svg += fmt::format(
        "<rect x=\"{}\" y=\"28\" width=\"14\" height=\"12\" fill=\"{}\" stroke=\"#999\" stroke-width=\"0.5\"/>"
        "<text class=\"legend\" x=\"{}\" y=\"38\">{}</text>\n",
        num(lx), fills[k], num(lx + 18), names[k]);
    lx += 18 + kCharWidth * static_cast<double>(std::string_view(names[k]).size()) + 18;
  }
  for (size_t i = 0; i < bars.size(); ++i) {
    const auto& b = bars[i];
    const double y = T + static_cast<double>(i) * (row_h + gap);
    const double parts[3] = {std::max(0.0, b.compute), std::max(0.0, b.wait), std::max(0.0, b.idle)};
    const double total = parts[0] + parts[1] + parts[2];
    svg += fmt::format("<text class=\"rank\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", L - 8,
                       num(y + row_h / 2 + 4), xml_escape(b.label));
    double x = L;
    for (int k = 0; k < 3 && total > 0; ++k) {
      const double w = parts[k] / total * (W - L - R);
      svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"/>\n", num(x), num(y), num(w),
                         row_h, fills[k]);
      x += w;
    }
    svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#888\"/>\n", L,
                       num(y), W - L - R, row_h);
    const auto pct = [&](double v) { return total > 0 ? 100.0 * v / total : 0.0; };
    svg += fmt::format("<text class=\"share\" x=\"{}\" y=\"{}\">compute {:.1f}% &#183; wait {:.1f}% &#183; untracked {:.1f}%</text>\n",
                       W - R + 10, num(y + row_h / 2 + 4), pct(parts[0]), pct(parts[1]), pct(parts[2]));
  }
  return svg + "</svg>\n";
}

std::string svg_schedule(const Schedule& s, const SimResult& r) {
  double shortest = 0;
  std::vector<TimelineBox> boxes;
  for (const auto& e : r.events) {
    const double d = e.end - e.start;
    if (d > 0 && (shortest == 0 || d < shortest)) shortest = d;
    boxes.push_back({e.rank, e.start, e.end, e.name(), e.category(), false});
  }
  Timeline t;
  t.id = "schedule";
  t.title = fmt::format("{}: makespan {:g}, bubble {:.1f}%", s.name.empty() ? "schedule" : s.name, r.makespan,
                        100 * r.bubble_fraction);
  t.x_label = "simulated time (cost units)";
  for (int rank = 0; rank < s.num_ranks; ++rank) t.row_labels.push_back(fmt::format("rank {}", rank));
  if (shortest > 0) t.width = static_cast<int>(std::clamp(112 + 40 * r.makespan / shortest, 1200.0, 6000.0));
  return svg_timeline(t, boxes);
}

}  // namespace pipetrain
