// One training step's forward and backward on a single stage: every microbatch's chunks go
// forward in order, then backward in reverse, and each chunk's stash is freed right after
// its backward. Parameter gradients are accumulated into the params' grads (not zeroed here).
#pragma once
#include <vector>

#include "kernels/cpu/cross_entropy.h"
#include "model/model.h"
#include "train/data.h"

namespace stateflow {

struct StepLoss {
  double loss = 0;  // mean loss over the batch's answer tokens
  LossStats stats;
};

// recompute: each layer's forward runs again inside its backward (--recompute full; the same
// results).
StepLoss forward_backward(Model& model, const Batch& batch, int microbatches,
                          const std::vector<int64_t>& chunk_lengths, bool recompute = false);

}  // namespace stateflow
