// The Mamba-3 mixer's config section ("mamba3" in a model config; docs/mamba3.md).
#pragma once
#include <cstdint>

#include <nlohmann/json_fwd.hpp>

namespace stateflow {

struct Mamba3Config {
  int64_t heads = 2;            // H
  int64_t head_dim = 8;         // P: channels of x (and of the output) per head
  int64_t state_size = 8;       // N: state columns per head; B and C have this width
  int64_t rank = 1;             // R: 1 = SISO, > 1 = MIMO of rank R
  int64_t groups = 1;           // G: B/C groups; heads h / (H/G) share B and C (before the biases)
  double rope_fraction = 0.5;   // share of the N state coordinates turned by the rotary angles
  int64_t block_size = 8;       // C: inner sub-chunk of the chunked core
  double a_floor = 1e-4;        // A = min(-softplus(dd_A), -a_floor): every head decays a little
  double norm_eps = 1e-5;       // RMSNorm of B and C

  // Rotary angles: NA = floor(N * rope_fraction / 2) coordinate pairs.
  int64_t angles() const { return int64_t(double(state_size) * rope_fraction / 2); }
  // Throws stateflow::Error naming the field ("mamba3.heads must be >= 1").
  void validate() const;
  nlohmann::json to_json() const;
  // Applies the fields present in j over *this; unknown fields are an error.
  void apply_json(const nlohmann::json& j);
  // Parameters of one mixer with model width d_model.
  int64_t num_parameters(int64_t d_model) const;
};

}  // namespace stateflow
