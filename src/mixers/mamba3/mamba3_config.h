// The Mamba-3 mixer's config section, "mamba3" (docs/mamba3.md): {"heads", "head_dim",
// "state_size", "rank", "groups", "rope_fraction", "block_size", "output_norm", "dt_min", "dt_max"} (MATH.md
// section 6 names: H, P, N, R, G, the share of N that rotates, C; the reference's
// is_outproj_norm; the range of the initial step sizes).
#pragma once
#include <cstdint>

#include "model/config.h"

namespace stateflow {

struct Mamba3Config {
  int64_t heads;         // H
  int64_t head_dim;      // P: channels of x (and of the output) per head
  int64_t state_size;    // N: state columns per head; B and C have this width
  int64_t rank;          // R: 1 = SISO, > 1 = MIMO of rank R
  int64_t groups;        // G: B/C groups; head h reads group h / (H/G)
  double rope_fraction;  // share of the N state coordinates the rotary angles turn
  int64_t block_size;    // C: inner sub-chunk of the chunked core
  bool output_norm;      // RMSNorm of each head's core output (per rank) before the silu(z) gate
  double dt_min, dt_max; // initial step sizes: softplus(dt_bias) log-uniform in [dt_min, dt_max] over heads

  // Rotary angles: NA = floor(N * rope_fraction / 2) coordinate pairs.
  int64_t angles() const { return int64_t(double(state_size) * rope_fraction / 2); }
};

// A = min(-softplus(dd_A), -kMamba3AFloor): every head keeps forgetting a little (MATH.md 6.1).
constexpr double kMamba3AFloor = 1e-4;

// The checked section of cfg; throws Error naming the field ("mamba3.heads = 0 is out of range ...").
Mamba3Config mamba3_config(const ModelConfig& cfg);

}  // namespace stateflow
