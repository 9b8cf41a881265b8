// Cutting a batch into pipeline units: microbatch m holds sequences [m*b, (m+1)*b) of the
// batch (b = batch / M), and chunk c is tokens [offset_c, offset_c + len_c) of each of them.
#pragma once
#include <vector>

#include "model/layer.h"
#include "pipeline/batch.h"

namespace stateflow {

struct Unit {
  ChunkCtx ctx;   // ctx.targets: int32 [b * len], -1 = no loss
  Tensor tokens;  // int32 [b * len]
};

class UnitPlan {
 public:
  // Throws when the batch does not divide into `microbatches` or the lengths don't fit.
  UnitPlan(const Batch& batch, int microbatches, std::vector<int64_t> chunk_lengths);
  int microbatches() const { return M_; }
  int chunks() const { return static_cast<int>(lengths_.size()); }
  const std::vector<int64_t>& chunk_lengths() const { return lengths_; }
  // Loss factor shared by every unit: 1 / (answer tokens in the whole batch, or in the global
  // batch a replica's slice is part of).
  double loss_scale() const { return loss_scale_; }
  // The unit's inputs; `stats` is where its loss layer adds loss and accuracy.
  Unit make_unit(int microbatch, int chunk, LossStats* stats) const;

 private:
  const Batch& batch_;
  int M_;
  std::vector<int64_t> lengths_, offsets_;
  double loss_scale_;
};

}  // namespace stateflow
