// Deterministic random numbers that are identical on every platform and every
// process layout: std::mt19937_64 plus our own uniform/normal transforms (the
// std:: distributions are implementation-defined).
#pragma once
#include <cstdint>
#include <random>
#include <string_view>

namespace pipetrain {

class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  // A generator for a named stream: the same (seed, name) always gives the same numbers.
  static Rng for_stream(uint64_t seed, std::string_view name);
  double uniform();  // [0, 1)
  double normal();   // N(0, 1), Box–Muller
  uint64_t next() { return gen_(); }

 private:
  std::mt19937_64 gen_;
  bool has_spare_ = false;
  double spare_ = 0.0;
};

// FNV-1a 64-bit hash (stable across platforms and runs).
uint64_t stable_hash(std::string_view s);

}  // namespace pipetrain
