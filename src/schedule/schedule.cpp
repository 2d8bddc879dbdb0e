// IR helpers of pipetrain/schedule/schedule.hpp: op_char, to_string, loop_placement,
// v_placement.
#include "pipetrain/schedule/schedule.hpp"

#include <fmt/format.h>

#include "pipetrain/core/error.hpp"

namespace pipetrain {

char op_char(Op op) {
  switch (op) {
    case Op::F: return 'F';
    case Op::B: return 'B';
    case Op::I: return 'I';
    case Op::W: return 'W';
  }
  return '?';
}

std::string to_string(const Action& a) {
  return fmt::format("{}{}{}", a.stage, op_char(a.op), a.microbatch);
}

namespace {
void check_counts(const char* what, int num_stages, int num_ranks) {
  if (num_ranks < 1) fail("{} placement needs at least one rank (got {})", what, num_ranks);
  if (num_stages < 0) fail("{} placement needs a non-negative stage count (got {})", what,
                           num_stages);
}
}  // namespace

std::vector<int> loop_placement(int num_stages, int num_ranks) {
  check_counts("loop", num_stages, num_ranks);
  std::vector<int> map(static_cast<size_t>(num_stages));
  for (int s = 0; s < num_stages; ++s) map[static_cast<size_t>(s)] = s % num_ranks;
  return map;
}

std::vector<int> v_placement(int num_stages, int num_ranks) {
  check_counts("v", num_stages, num_ranks);
  std::vector<int> map(static_cast<size_t>(num_stages));
  for (int s = 0; s < num_stages; ++s) {
    const int chunk = s / num_ranks, pos = s % num_ranks;
    map[static_cast<size_t>(s)] = chunk % 2 == 0 ? pos : num_ranks - 1 - pos;
  }
  return map;
}

}  // namespace pipetrain
