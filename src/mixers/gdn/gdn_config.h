// The Gated DeltaNet mixer's config section, "gdn": {"heads", "head_dk", "head_dv",
// "conv_size", "block_size"} (MATH.md section 2 names: H, dk, dv, K, C).
#pragma once
#include <cstdint>

#include "model/config.h"

namespace stateflow {

struct GdnConfig {
  int64_t heads;       // q/k and value heads alike
  int64_t head_dk;     // key/query head size
  int64_t head_dv;     // value head size
  int64_t conv_size;   // short conv kernel K
  int64_t block_size;  // inner sub-chunk size C of the chunkwise core
};

// The checked section of cfg; throws Error naming the field ("gdn.heads = 0 is out of range ...").
GdnConfig gdn_config(const ModelConfig& cfg);

}  // namespace stateflow
