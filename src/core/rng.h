// Deterministic random numbers (xoshiro256**, seeded by splitmix64). The same seed gives the
// same stream on every platform and compiler, and the state can be saved in a checkpoint.
#pragma once
#include <array>
#include <cstdint>

namespace stateflow {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0);
  uint64_t next_u64();
  double uniform();                         // [0, 1)
  double uniform(double lo, double hi);     // [lo, hi)
  double normal();                          // standard normal (Box-Muller): always two draws
  uint64_t below(uint64_t n);               // [0, n), unbiased
  // An independent stream derived from this one's seed and `stream` (for per-layer init etc.).
  static Rng derive(uint64_t seed, uint64_t stream);
  // Skips the next `draws` draws (as that many next_u64 calls would) in microseconds, whatever
  // the count: a stream can be cut into pieces that are drawn in parallel (fill_normal).
  void advance(uint64_t draws);
  std::array<uint64_t, 4> state() const { return s_; }
  void set_state(const std::array<uint64_t, 4>& s) { s_ = s; }

 private:
  std::array<uint64_t, 4> s_{};
};

}  // namespace stateflow
