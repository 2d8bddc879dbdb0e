// validate() of pipetrain/schedule/validate.hpp: structure, same-rank order, progress.
#include "pipetrain/schedule/validate.hpp"

#include "pipetrain/schedule/dataflow.hpp"

namespace pipetrain {

void validate(const Schedule& s) {
  const ActionTable table(s);
  check_rank_order(s, table);
  run_dataflow(s, table, Costs{});
}

}  // namespace pipetrain
