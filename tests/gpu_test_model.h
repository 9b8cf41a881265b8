// The model of the GPU tests, in a header of its own so that CPU tests can build it too (the
// CPU side of a GPU conformance case: tests/per_head_scalar_band.h's test).
#pragma once
#include <cstdint>

#include "model/config.h"

namespace stateflow::testing {

// The smallest model the CUDA kernels run (GDN heads of 128, sub-chunks of 64, widths that
// are multiples of 8): the model of the GPU tests.
inline ModelConfig gpu_test_model(uint64_t seed, int64_t vocab = 512) {
  ModelConfig c;
  c.vocab_size = vocab, c.d_model = 256, c.pattern = "GG", c.mlp_hidden = 512, c.seed = seed;
  c.mixers["gdn"] = {{"heads", 2}, {"head_dk", 128}, {"head_dv", 128}, {"conv_size", 4}, {"block_size", 64}};
  c.complete_sections();
  return c;
}

}  // namespace stateflow::testing
