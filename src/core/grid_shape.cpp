#include "pipetrain/core/grid_shape.hpp"

#include <fmt/format.h>

#include <array>

#include "pipetrain/core/error.hpp"

namespace pipetrain {

namespace {
// The atomic dimensions in kRankOrder's order, and each one's extent in a shape.
constexpr std::array<std::string_view, 5> kAxes = {"pp", "edp", "ep", "cp", "tp"};
using Extents = std::array<int, kAxes.size()>;

Extents extents(const GridShape& g) { return {g.pp, g.dp / g.ep, g.ep, g.cp, g.tp}; }

Extents axis_coords(const GridCoords& c) { return {c.pp, c.edp, c.ep, c.cp, c.tp}; }

// Bit i set: the group spans kAxes[i].
unsigned axes_of(std::string_view dims) {
  unsigned mask = 0;
  while (!dims.empty()) {
    const size_t dash = dims.find('-');
    const std::string_view name = dims.substr(0, dash);
    dims = dash == std::string_view::npos ? std::string_view{} : dims.substr(dash + 1);
    if (name == "dp") {
      mask |= 0b00110;  // edp and ep
      continue;
    }
    size_t i = 0;
    while (i < kAxes.size() && kAxes[i] != name) ++i;
    if (i == kAxes.size()) fail("no grid dimension \"{}\" (the dimensions: {}, and dp = edp-ep)", name, kRankOrder);
    mask |= 1U << i;
  }
  return mask;
}

// The mixed-radix number of `rank`'s coordinates on the axes `in_group` selects
// (in_group true) or on the others (false), in the rank order.
int place(const GridShape& g, int rank, std::string_view dims, bool in_group) {
  const unsigned mask = axes_of(dims);
  const Extents n = extents(g), c = axis_coords(g.coords_of(rank));
  int value = 0;
  for (size_t i = 0; i < kAxes.size(); ++i)
    if (((mask >> i) & 1U) == static_cast<unsigned>(in_group)) value = value * n[i] + c[i];
  return value;
}
}  // namespace

GridCoords GridShape::coords_of(int rank) const {
  GridCoords c;
  c.tp = rank % tp;
  c.cp = (rank / tp) % cp;
  c.dp = (rank / (tp * cp)) % dp;
  c.pp = rank / (tp * cp * dp);
  c.ep = c.dp % ep;
  c.edp = c.dp / ep;
  return c;
}

int GridShape::rank_of(const GridCoords& c) const { return ((c.pp * dp + c.dp) * cp + c.cp) * tp + c.tp; }

int GridShape::group_color(int rank, std::string_view dims) const { return place(*this, rank, dims, false); }

int GridShape::group_rank(int rank, std::string_view dims) const { return place(*this, rank, dims, true); }

std::string GridShape::text() const { return fmt::format("dp {} x pp {} x cp {} x tp {}, ep {}", dp, pp, cp, tp, ep); }

}  // namespace pipetrain
