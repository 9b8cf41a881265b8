// A whole model run forward for inference, one chunk at a time, each stateful layer's
// boundary state carried from chunk to chunk: recurrent inference, whose memory does not grow
// with the length. Every layer runs through its chunk interface (Layer::forward), the code
// that trains it; a chunk's stash is dropped as soon as the chunk is through. A chunk of one
// token is a generation step.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/cpu/cross_entropy.h"
#include "model/model.h"

namespace stateflow {

class RecurrentForward {
 public:
  // The model must hold all its layers (embedding to LM head).
  explicit RecurrentForward(Model& model);
  // All layers of a model in order, wherever they are held (a trainer's pipeline stages run
  // in this process), and its vocabulary size.
  RecurrentForward(std::vector<Layer*> layers, int64_t vocab_size);
  // Runs the next chunk of `batch` sequences: tokens and targets are int32 [batch * len], row
  // by row (targets -1: no loss there). Adds the chunk's loss sum, correct and counted tokens
  // to *stats when given; stores its logits [batch * len, vocab] (host) in *logits when given.
  void forward(const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets, int64_t batch,
               LossStats* stats, Tensor* logits = nullptr);
  // The next chunk starts new sequences (every boundary state back to zero).
  void reset();
  int64_t position() const { return position_; }  // tokens per sequence since reset()

 private:
  std::vector<Layer*> layers_;
  int64_t vocab_;
  std::vector<State> states_;  // per layer: what the last chunk emitted
  int64_t batch_ = 0, position_ = 0;
  int chunk_ = 0;
};

}  // namespace stateflow
