#include "model/flops.h"

namespace stateflow {

CoreFlops gdn_core_flops_per_head_token(double dk, double dv, double C) {
  return {6 * dk * dv + 2 * C * (3 * dk + 2 * dv) + 2 * C * C / 3, 18 * dk * dv + 18 * C * dk + 10 * C * dv + 4 * C * C};
}

BlockFlops block_flops_per_token(const ModelConfig& m) {
  const double d = double(m.d_model), H = double(m.n_heads), dk = double(m.head_dk), dv = double(m.head_dv);
  const double C = double(m.block_size), F = double(m.mlp_hidden);
  // Weight matrices: q, k, v, the output gate, beta and g projections; output projection; MLP.
  const double matrices = d * (2 * H * dk + 2 * H * dv + 2 * H) + H * dv * d + 3 * d * F;
  BlockFlops f;
  f.matrices_forward = 2 * matrices, f.matrices_backward = 4 * matrices;
  const CoreFlops core = gdn_core_flops_per_head_token(dk, dv, C);
  f.core_forward = H * core.forward, f.core_backward = H * core.backward;
  return f;
}

ModelFlops model_flops_per_token(const ModelConfig& m) {
  const BlockFlops b = block_flops_per_token(m);
  const double L = double(m.n_layers), head = 6 * double(m.d_model) * double(m.vocab_size);
  return {L * (b.matrices_forward + b.matrices_backward) + head, L * (b.core_forward + b.core_backward)};
}

}  // namespace stateflow
