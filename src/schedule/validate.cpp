// validate() of pipetrain/schedule/validate.hpp: the schedule's structure and same-rank
// order in its own terms, then everything else on its lowered program.
#include "pipetrain/schedule/validate.hpp"

#include <climits>

#include "pipetrain/schedule/action_table.hpp"
#include "pipetrain/schedule/program.hpp"

namespace pipetrain {

void validate(const Schedule& s) {
  const ActionTable table(s);
  check_rank_order(s, table);
  // Tags belong to the communicator that will carry them (the trainer lowers with the
  // real MPI_TAG_UB); a schedule itself is bounded by none.
  const Program p = lower(s, {LowerOptions{}.recv_lookahead, INT_MAX});
  validate_program(p, INT_MAX);
}

}  // namespace pipetrain
