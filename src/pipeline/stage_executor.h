// Runs the units of one pipeline stage through its contiguous slice of the model's layers:
// forward of (m, c) takes each layer's boundary state from chunk c-1 and stores what chunk c
// emits; backward of (m, c) takes the state gradient from chunk c+1, stores the one for
// chunk c-1, and frees the unit's stash as soon as it ends. The order of the calls is the
// caller's (a schedule); this class only keeps the bookkeeping right.
#pragma once
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "model/layer.h"
#include "pipeline/state_store.h"

namespace stateflow {

class StageExecutor {
 public:
  // layers: this stage's slice; first_layer: its index in the whole model (state keys).
  StageExecutor(std::vector<Layer*> layers, int first_layer);
  // x: token ids on the first stage, hidden states otherwise. Returns the hidden states for
  // the next stage, or the unit's loss (1 element) on the last stage.
  Tensor forward(const ChunkCtx& ctx, const Tensor& x);
  // dy: gradient of this stage's output (ignored on the last stage, where the loss starts
  // backprop). Returns the gradient of the stage input (undefined on the first stage).
  Tensor backward(const ChunkCtx& ctx, const Tensor& dy);
  // Units forwarded whose backward has not run yet.
  size_t units_in_flight() const { return stash_.size(); }

 private:
  std::vector<Layer*> layers_;
  int first_layer_;
  std::map<std::pair<int, int>, std::vector<std::unique_ptr<Stash>>> stash_;  // (m, c) -> per layer
  StateStore states_;       // forward boundary states
  StateStore state_grads_;  // their gradients, flowing backward
};

}  // namespace stateflow
