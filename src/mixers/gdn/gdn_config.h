// The Gated DeltaNet mixer's config section, "gdn": {"heads", "value_heads", "head_dk", "head_dv",
// "conv_size", "block_size", "keep_sweep"} (MATH.md section 2 names: H, HV, dk, dv, K, C).
#pragma once
#include <cstdint>

#include "model/config.h"

namespace stateflow {

struct GdnConfig {
  int64_t heads;        // query/key heads H
  int64_t value_heads;  // value heads HV, a multiple of H (the section's 0 means H): value head j
                        // reads q/k head j / (HV / H), as Qwen3-Next's and fla's grouped values
  int64_t head_dk;      // key/query head size
  int64_t head_dv;      // value head size
  int64_t conv_size;    // short conv kernel K
  int64_t block_size;   // inner sub-chunk size C of the chunkwise core
  // GPU: keep the core's forward sweep, its inputs G and W and results V_new and each sub-chunk's
  // entering state (4 + 2 dk + 2 dv (1 + dk / C) bytes per token and value head, 1028 at 128 / 64),
  // in the stash, so the backward neither sweeps the sequence forward again nor re-runs Pre. Memory
  // for time; the same results. The CPU layer ignores it.
  bool keep_sweep;

  int64_t group() const { return value_heads / heads; }  // value heads per q/k head
};

// The checked section of cfg; throws Error naming the field ("gdn.heads = 0 is out of range ...").
GdnConfig gdn_config(const ModelConfig& cfg);

}  // namespace stateflow
