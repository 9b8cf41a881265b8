#include "train/step.h"

#include "pipeline/stage_executor.h"
#include "pipeline/units.h"

namespace stateflow {

StepLoss forward_backward(Model& model, const Batch& batch, int microbatches,
                          const std::vector<int64_t>& chunk_lengths, bool recompute) {
  UnitPlan plan(batch, microbatches, chunk_lengths);
  StageExecutor stage(model.layers(), model.begin(), recompute);
  StepLoss out;
  for (int m = 0; m < plan.microbatches(); ++m) {
    std::vector<Unit> units;
    for (int c = 0; c < plan.chunks(); ++c) {
      units.push_back(plan.make_unit(m, c, &out.stats));
      out.loss += stage.forward(units[c].ctx, units[c].tokens).item();
    }
    for (int c = plan.chunks() - 1; c >= 0; --c) stage.backward(units[c].ctx, Tensor());
  }
  return out;
}

}  // namespace stateflow
