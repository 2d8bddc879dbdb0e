// parse_recompute() of pipetrain/model/layer.hpp.
#include "pipetrain/model/layer.hpp"

#include "pipetrain/core/error.hpp"

namespace pipetrain {

Recompute parse_recompute(const std::string& mode) {
  if (mode == "none") return Recompute::None;
  if (mode == "selective") return Recompute::Selective;
  if (mode == "full") return Recompute::Full;
  fail("train.recompute: unknown mode \"{}\" (expected \"none\", \"selective\" or \"full\")", mode);
}

}  // namespace pipetrain
