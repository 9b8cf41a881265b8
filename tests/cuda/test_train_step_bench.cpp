// The training-step benchmark of kernels_bench: on the GPU it times whole steps of a small
// model: every timed step, phases that add up to the step, finite losses, memory counted.
#include <gtest/gtest.h>

#include <cmath>

#include "cuda_test_util.h"
#include "test_util.h"
#include "train/cuda/train_step_bench.h"

namespace stateflow {
namespace {

using testing::fresh_seed;

TEST(TrainStepBench, TimesWholeStepsOfASmallModel) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  TrainStepBenchOptions o;
  o.model = testing::gpu_test_model(fresh_seed());
  o.model.seed = seed;
  o.batch = 2, o.seq_len = 128, o.warmup_steps = 1, o.steps = 3;
  const TrainStepBenchResult r = bench_training_steps(o);
  ASSERT_EQ(r.steps.size(), 3u);
  ASSERT_EQ(r.losses.size(), 3u);
  for (size_t i = 0; i < r.steps.size(); ++i) {
    const StepPhases& s = r.steps[i];
    EXPECT_GT(s.forward_backward, 0) << i;
    EXPECT_GT(s.grad_norm, 0) << i;
    EXPECT_GT(s.update, 0) << i;
    EXPECT_NEAR(s.total, s.forward_backward + s.grad_norm + s.update, 1e-9) << i;
    EXPECT_TRUE(std::isfinite(r.losses[i])) << i;
  }
  // fp32 weights (+ bf16 copies), grads, and AdamW's m and v: 8 bytes per parameter.
  const int64_t params = o.model.num_parameters();
  EXPECT_GE(r.tracked.peak_of(MemCategory::Weights), 4 * params);
  EXPECT_GE(r.tracked.peak_of(MemCategory::Grads), 4 * params);
  EXPECT_GE(r.tracked.peak_of(MemCategory::Optimizer), 8 * params);
  EXPECT_GT(r.tracked.peak_of(MemCategory::Activations), 0);
  EXPECT_GE(r.allocator_reserved, r.tracked.current_of(MemCategory::Weights));
  // The driver sees every block of our allocator (and more: the context, other allocators).
  EXPECT_GE(r.driver_used_peak, r.allocator_reserved);
  EXPECT_GT(r.driver_used_before, 0);
}

}  // namespace
}  // namespace stateflow
