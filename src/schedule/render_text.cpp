// render_text() of pipetrain/schedule/render.hpp: the ranks x time-slots grid.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "pipetrain/schedule/render.hpp"

namespace pipetrain {

std::string render_text(const Schedule& s, const SimResult& r) {
  double unit = 0;
  size_t width = 1;
  for (const auto& e : r.events) {
    const double d = e.end - e.start;
    if (d > 0 && (unit == 0 || d < unit)) unit = d;
    width = std::max(width, e.name().size());
  }
  if (unit == 0) unit = 1;
  const auto slots = static_cast<size_t>(std::ceil(r.makespan / unit - 1e-9));
  const auto R = static_cast<size_t>(s.num_ranks);
  std::vector<std::vector<std::string>> grid(R, std::vector<std::string>(slots, "."));
  for (const auto& e : r.events) {
    // Slots whose midpoint falls inside the action belong to it.
    const auto first = static_cast<size_t>(std::max(0.0, std::round(e.start / unit)));
    const auto last = static_cast<size_t>(std::max(0.0, std::round(e.end / unit)));
    for (size_t k = first; k < last && k < slots; ++k)
      grid[static_cast<size_t>(e.rank)][k] =
          k == first ? e.name() : std::string(width, '-');
  }
  const std::string label = fmt::format("rank {}", s.num_ranks - 1);
  std::string out = fmt::format("{:<{}}", "time", label.size());
  for (size_t k = 0; k < slots; ++k) {
    const std::string t = k % 5 == 0 ? fmt::format("{:g}", static_cast<double>(k) * unit) : "";
    out += fmt::format(" {:<{}}", t, width);
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  out += '\n';
  for (size_t rank = 0; rank < R; ++rank) {
    std::string line = fmt::format("{:<{}}", fmt::format("rank {}", rank), label.size());
    for (const auto& cell : grid[rank]) line += fmt::format(" {:>{}}", cell, width);
    out += line + '\n';
  }
  return out;
}

}  // namespace pipetrain
