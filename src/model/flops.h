// Model FLOPs per token as MATH.md section 9 counts them (reference/cost_model.py): matrix
// products only, a multiply-add is 2 FLOPs; the GDN chunk core is charged full C x C tiles.
// Not counted: the embedding lookup, element-wise work, the optimizer, and the LM head's
// logits recomputed in backward. One count for the MFU of the benchmarks and for scaling
// measured costs to other models.
#pragma once
#include "model/config.h"

namespace stateflow {

// The GDN chunk core per value head and token, with blocks of C tokens: {forward, backward}
// (backward recomputes W, U and the state transition).
struct CoreFlops {
  double forward = 0, backward = 0;
};
CoreFlops gdn_core_flops_per_head_token(double dk, double dv, double C);

// One GDN block (mixer + MLP) per token.
struct BlockFlops {
  double matrices_forward = 0, matrices_backward = 0;  // projections and MLP: 2 and 4 per weight
  double core_forward = 0, core_backward = 0;          // the GDN chunk core (backward recomputes W, U, ST)
  double forward() const { return matrices_forward + core_forward; }
  double backward() const { return matrices_backward + core_backward; }
};
BlockFlops block_flops_per_token(const ModelConfig& m);

// A whole training step (forward + backward) per token.
struct ModelFlops {
  double dense = 0;     // every block's projections and MLP, and the LM head: 6 per weight
  double gdn_core = 0;  // every block's GDN chunk core
  double total() const { return dense + gdn_core; }
};
ModelFlops model_flops_per_token(const ModelConfig& m);

}  // namespace stateflow
