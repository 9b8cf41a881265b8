#include "model/flops.h"

#include "model/mixer.h"

namespace stateflow {

BlockFlops block_flops_per_token(const ModelConfig& m, char letter) {
  const MixerFlops mixer = mixer_for_letter(letter).flops_per_token(m);
  const double mlp = 3 * double(m.d_model) * double(m.mlp_hidden);
  return {mixer.dense_forward + 2 * mlp, mixer.dense_backward + 4 * mlp, mixer.core_forward, mixer.core_backward};
}

ModelFlops model_flops_per_token(const ModelConfig& m) {
  ModelFlops f{6 * double(m.d_model) * double(m.vocab_size), 0};
  for (char letter : m.blocks()) {
    const BlockFlops b = block_flops_per_token(m, letter);
    f.dense += b.matrices_forward + b.matrices_backward;
    f.core += b.core_forward + b.core_backward;
  }
  return f;
}

}  // namespace stateflow
