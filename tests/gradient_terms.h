// How well conditioned a parameter's gradient is: a gradient is a sum over tokens of per-token
// terms (for a per-head scalar such as dt_bias, one term per token of both signs), and rounding
// each term (bf16 on the GPU) shows relative to the sum of the terms' magnitudes, not relative
// to their net, which cancellation can make hundreds of times smaller.
#pragma once
#include <cmath>
#include <vector>

#include "model/model.h"
#include "model/optimizer.h"
#include "pipeline/stage_executor.h"
#include "pipeline/units.h"
#include "train/data.h"

namespace stateflow::testing {

// The per-token terms of the gradients of the parameters `which` (indices into model.params()),
// measured as the step the model takes with every token its own chunk: a chunk's backward adds
// exactly its tokens' terms (their effect on every later token included, through the boundary
// state's gradient). Returns, per parameter of `which`, the float64 sum over tokens of each
// entry's |term| (the batch's sequences share a token position: their terms add first), and
// leaves the model's gradients as that chunked step's. Costs one unit per token: a test's size.
inline std::vector<std::vector<double>> gradient_term_magnitudes(Model& model, const Batch& batch,
                                                                 const std::vector<size_t>& which) {
  auto params = model.params();
  zero_grads(params);
  const UnitPlan plan(batch, 1, std::vector<int64_t>(batch.seq_len, 1));
  StageExecutor stage(model.layers(), model.begin());
  LossStats stats;
  std::vector<Unit> units;
  for (int c = 0; c < plan.chunks(); ++c) {
    units.push_back(plan.make_unit(0, c, &stats));
    stage.forward(units[c].ctx, units[c].tokens);
  }
  std::vector<std::vector<double>> magnitude, before;
  for (size_t i : which) {
    magnitude.emplace_back(params[i]->grad.numel(), 0.0);
    before.emplace_back(params[i]->grad.numel(), 0.0);
  }
  for (int c = plan.chunks() - 1; c >= 0; --c) {
    stage.backward(units[c].ctx, Tensor());
    for (size_t k = 0; k < which.size(); ++k) {
      const Tensor g = params[which[k]]->grad.cast(DType::F64);
      for (int64_t e = 0; e < g.numel(); ++e) {
        magnitude[k][e] += std::abs(g.data<double>()[e] - before[k][e]);
        before[k][e] = g.data<double>()[e];
      }
    }
  }
  return magnitude;
}

}  // namespace stateflow::testing
