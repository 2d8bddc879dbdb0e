// choose_dense_paths and its parts (pipetrain/plan/product_choice.hpp).
#include "pipetrain/plan/product_choice.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace pipetrain {

std::vector<DenseShapeCount> dense_weight_shapes(const ModelConfig& m, int tp) {
  const int C = m.d_model;
  std::vector<DenseShapeCount> out;
  auto add = [&](DenseShape s, int n) {
    if (n <= 0 || s.out <= 0 || s.in <= 0) return;
    for (DenseShapeCount& c : out)
      if (c.shape == s) {
        c.count += n;
        return;
      }
    out.push_back({s, n});
  };
  int mlp_blocks = 0;
  for (int b = 0; b < m.n_layer; ++b) mlp_blocks += m.moe(b) ? 0 : 1;
  if (m.family().blocks == BlockKind::Llama) {
    const int hd = C / m.n_head;
    add({(m.n_head + 2 * m.kv_heads()) * hd / tp, C}, m.n_layer);
    add({C, C / tp}, m.n_layer);
    add({m.ffn() / tp, C}, 2 * mlp_blocks);  // gate and up
    add({C, m.ffn() / tp}, mlp_blocks);
  } else {
    add({3 * C / tp, C}, m.n_layer);
    add({C, C / tp}, m.n_layer);
    add({4 * C / tp, C}, mlp_blocks);
    add({C, 4 * C / tp}, mlp_blocks);
  }
  add({m.padded_vocab() / tp, C}, 1);
  return out;
}

DenseShape timed_shape(DenseShape s) { return {std::min(s.out, kTimedOutMax), s.in}; }

bool packing_pays(double saved_per_use, double plain_per_use, double reorders, int uses_per_step) {
  return saved_per_use > kPackMargin * plain_per_use && uses_per_step * saved_per_use > reorders;
}

namespace {

double plain_time(const DenseShapeUse& u, const DensePaths& p, int product) {
  const auto& t = p.library[product] == ProductLibrary::Onednn ? u.times.onednn : u.times.blas;
  return t[product];
}

}  // namespace

DenseChoice choose_dense_paths(const std::vector<DenseShapeUse>& shapes, std::optional<ProductLibrary> library,
                               Toggle pack, int uses_per_step) {
  DenseChoice c;
  std::vector<std::string> said;
  for (const DenseProduct p : {kForward, kInputGradient, kWeightGradient}) {
    double blas = 0, onednn = 0;
    bool have_onednn = !shapes.empty();
    for (const DenseShapeUse& u : shapes) {
      blas += u.count * u.scale * u.times.blas[p];
      onednn += u.count * u.scale * u.times.onednn[p];
      have_onednn = have_onednn && u.times.onednn[p] > 0;
    }
    if (library) {
      c.paths.library[p] = *library;
    } else if (have_onednn && onednn < (1 - kLibraryMargin) * blas) {
      c.paths.library[p] = ProductLibrary::Onednn;
      said.push_back(fmt::format("{} oneDNN ({:.2f}x the BLAS's speed)", product_name(p), blas / onednn));
    } else if (have_onednn) {
      said.push_back(fmt::format("{} BLAS ({:.2f}x oneDNN's speed)", product_name(p), onednn / blas));
    }
  }
  if (library) said.push_back(fmt::format("{} (runtime.dense_products)", library_name(*library)));
  if (pack == Toggle::Auto) {
    std::vector<std::string> packed;
    double saved_total = 0, reorders_total = 0;
    for (const DenseShapeUse& u : shapes) {
      if (u.times.packed[0] <= 0 || u.times.packed[1] <= 0 || u.times.reorder < 0) continue;
      const double plain = plain_time(u, c.paths, kForward) + plain_time(u, c.paths, kInputGradient);
      const double saved = plain - u.times.packed[0] - u.times.packed[1];
      if (!packing_pays(saved, plain, u.times.reorder, uses_per_step)) continue;
      c.paths.packed.push_back(u.shape);
      const double n = u.count * u.scale;
      saved_total += n * uses_per_step * saved;
      reorders_total += n * u.times.reorder;
      packed.push_back(fmt::format("{}x{}", u.shape.out, u.shape.in));
    }
    if (!packed.empty())
      said.push_back(fmt::format("packed {} (saves {:.1f} ms a step for {:.1f} ms of reorders)",
                                 fmt::join(packed, ", "), 1e3 * saved_total, 1e3 * reorders_total));
    else if (!shapes.empty())
      said.push_back(uses_per_step > 0 ? "not packed (no shape's saving pays for its reorders)"
                                       : "not packed (no updates to reorder for)");
  }
  c.why = fmt::format("{}", fmt::join(said, "; "));
  return c;
}

}  // namespace pipetrain
