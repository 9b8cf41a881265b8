#include "model/flops.h"

#include "model/mixer.h"

namespace stateflow {

double mean_keys_per_token(int64_t seq_len) { return double(seq_len + 1) / 2; }

BlockFlops block_flops_per_token(const ModelConfig& m, char letter, int64_t seq_len) {
  const MixerFlops mixer = mixer_for_letter(letter).flops_per_token(m);
  const double mlp = 3 * double(m.d_model) * double(m.mlp_hidden), keys = mean_keys_per_token(seq_len);
  return {mixer.dense_forward + 2 * mlp, mixer.dense_backward + 4 * mlp,
          mixer.core_forward + keys * mixer.core_forward_per_key, mixer.core_backward + keys * mixer.core_backward_per_key};
}

ModelFlops model_flops_per_token(const ModelConfig& m, int64_t seq_len) {
  ModelFlops f{6 * double(m.d_model) * double(m.vocab_size), 0};
  for (char letter : m.blocks()) {
    const BlockFlops b = block_flops_per_token(m, letter, seq_len);
    f.dense += b.matrices_forward + b.matrices_backward;
    f.core += b.core_forward + b.core_backward;
  }
  return f;
}

}  // namespace stateflow
