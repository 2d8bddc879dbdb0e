#include "pipetrain/plan/shard_plan.hpp"

#include "pipetrain/plan/cost_model.hpp"

namespace pipetrain {

ShardPlacement shard_placement(const Layout& l) {
  ShardPlacement o;
  o.gradients = l.shard >= ShardLevel::Gradients;
  o.weights = l.shard == ShardLevel::Weights;
  o.prefetch = l.shard_prefetch;
  o.keep = l.shard_keep;
  return o;
}

ShardUnits shard_units(const ModelConfig& model, const Layout& l, const Schedule& s,
                       const std::vector<StageUnits>& split) {
  ShardUnits out;
  out.layers.resize(static_cast<size_t>(s.num_ranks));
  out.elems.resize(static_cast<size_t>(s.num_ranks));
  const bool tied = model.tied() && !l.vocab_parallel;
  const double table = unit_params(model, UnitKind::Head).sharded / l.tp;
  const ShardSpans spans = shard_spans(l, l.shard_group);
  for (int r = 0; r < s.num_ranks; ++r) {
    auto& layers = out.layers[static_cast<size_t>(r)];
    auto& elems = out.elems[static_cast<size_t>(r)];
    bool have_table = false;
    UnitRef table_unit;
    for (int st = 0; st < s.num_stages; ++st) {
      if (s.stage_to_rank[static_cast<size_t>(st)] != r) continue;
      const auto pieces = stage_pieces(model, split[static_cast<size_t>(st)]);
      auto& uses = layers[st];
      uses.resize(pieces.size());
      for (size_t k = 0; k < pieces.size(); ++k) {
        const StagePiece& x = pieces[k];
        const bool end = x.kind == UnitKind::Embedding || x.kind == UnitKind::Head;
        double own = unit_params(model, x.kind, x.block).on_rank(l.tp, l.ep);
        if (tied && end) {
          if (!have_table) {  // declared at its first layer on this rank, numbered after the stage's layers
            table_unit = {st, static_cast<int>(pieces.size())};
            elems[table_unit] = static_cast<int64_t>(ShardSpans::gathered(table, spans.dense));
            have_table = true;
          }
          own -= table;
        }
        // Expert-parallel experts (ep > 1): a unit of their own, numbered after the table's
        // place. (A unit one rank of its group holds alone counts 0: ShardSpans::gathered.)
        const double experts = l.ep > 1 ? unit_params(model, x.kind, x.block).experts / (l.ep * l.tp) : 0.0;
        if (own - experts > 0) {
          const UnitRef mine{st, static_cast<int>(k)};
          elems[mine] = static_cast<int64_t>(ShardSpans::gathered(own - experts, spans.dense));
          uses[k].push_back(mine);
        }
        if (experts > 0) {
          const UnitRef theirs = expert_unit(st, static_cast<int>(pieces.size()), static_cast<int>(k));
          elems[theirs] = static_cast<int64_t>(ShardSpans::gathered(experts, spans.experts));
          uses[k].push_back(theirs);
        }
        if (tied && end) uses[k].push_back(table_unit);
      }
    }
  }
  return out;
}

}  // namespace pipetrain
