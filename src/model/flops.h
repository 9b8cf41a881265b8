// Model FLOPs per token as MATH.md section 9 counts them (reference/cost_model.py): matrix
// products only, a multiply-add is 2 FLOPs; each mixer counts its own (model/mixer.h; the GDN
// chunk core is charged full C x C tiles). Not counted: the embedding lookup, element-wise work,
// the optimizer, and the LM head's logits recomputed in backward. One count for the MFU of the
// benchmarks, for scaling measured costs to other models and for cutting stages by cost.
#pragma once
#include "model/config.h"

namespace stateflow {

// Keys a token attends to on average in a causal sequence of seq_len tokens: (seq_len + 1) / 2.
double mean_keys_per_token(int64_t seq_len);

// One block (its mixer + the MLP) per token, averaged over a causal sequence of seq_len tokens
// (attention's core counts mean_keys_per_token(seq_len) keys per token; recurrences none).
struct BlockFlops {
  double matrices_forward = 0, matrices_backward = 0;  // projections and MLP: 2 and 4 per weight
  double core_forward = 0, core_backward = 0;          // the mixer's sequence core
  double forward() const { return matrices_forward + core_forward; }
  double backward() const { return matrices_backward + core_backward; }
};
// The block whose letter in the layer pattern is `letter`.
BlockFlops block_flops_per_token(const ModelConfig& m, char letter, int64_t seq_len);

// A whole training step (forward + backward) per token of a sequence of seq_len tokens.
struct ModelFlops {
  double dense = 0;  // every block's projections and MLP, and the LM head: 6 per weight
  double core = 0;   // every block's mixer core
  double total() const { return dense + core; }
};
ModelFlops model_flops_per_token(const ModelConfig& m, int64_t seq_len);

}  // namespace stateflow
