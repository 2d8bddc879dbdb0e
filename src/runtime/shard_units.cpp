#include "pipetrain/runtime/shard_units.hpp"

#include <algorithm>
#include <set>

#include "pipetrain/core/error.hpp"

namespace pipetrain {

RankUnits number_units(const std::map<int, ModelStage*>& stages, bool tied) {
  RankUnits out;
  auto add_unit = [&](const UnitRef& u) {
    out.units.push_back(u);
    out.params.emplace_back();
    return static_cast<int>(out.units.size()) - 1;
  };
  for (const auto& [s, stage] : stages) {
    auto& layers = stage->layers();
    auto& uses = out.layers[s];
    uses.resize(layers.size());
    const int n = static_cast<int>(layers.size());
    for (int l = 0; l < n; ++l) {
      int own = -1, experts = -1;  // this layer's units, made at their first new parameter
      std::set<int> touched;
      for (Parameter* p : layers[static_cast<size_t>(l)]->parameters()) {
        if (!p->trained) continue;  // state the optimizer never touches stays whole (a router's selection bias)
        if (p->unit < 0) {
          if (tied && p->name == "wte") {
            p->unit = add_unit({s, n});
          } else if (p->expert_parallel) {
            if (experts < 0) experts = add_unit(expert_unit(s, n, l));
            p->unit = experts;
          } else {
            if (own < 0) own = add_unit({s, l});
            p->unit = own;
          }
          out.params[static_cast<size_t>(p->unit)].push_back(p);
        }
        touched.insert(p->unit);
      }
      for (int u : touched) uses[static_cast<size_t>(l)].push_back(out.units[static_cast<size_t>(u)]);
    }
  }
  return out;
}

void check_units(const RankUnits& numbered, const std::map<int, std::vector<std::vector<UnitRef>>>& planned) {
  auto sorted = [](std::vector<UnitRef> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  for (const auto& [s, layers] : numbered.layers) {
    const auto it = planned.find(s);
    if (it == planned.end() || it->second.size() != layers.size())
      fail("sharded data parallelism: stage {} has {} layers here, the plan's units say otherwise", s, layers.size());
    for (size_t l = 0; l < layers.size(); ++l)
      if (sorted(layers[l]) != sorted(it->second[l]))
        fail("sharded data parallelism: stage {}, layer {}: its parameters' units differ from the plan's", s, l);
  }
}

}  // namespace pipetrain
