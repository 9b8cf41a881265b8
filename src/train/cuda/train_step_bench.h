// Whole training steps on the GPU, timed for kernels_bench: one stage, one chunk, batches of
// the recall task drawn before the clock starts. A step is what Trainer::step runs: zero the
// gradients, forward + backward, the global gradient norm, clipping and the AdamW update
// (which also re-casts the bf16 GEMM copies of the weights); the device is synchronised at
// each phase's end so that the phases can be told apart.
#pragma once
#include <cstdint>
#include <vector>

#include "core/allocator.h"
#include "model/config.h"

namespace stateflow {

struct TrainStepBenchOptions {
  ModelConfig model = model_preset("gdn-1.3b");
  int64_t batch = 1, seq_len = 32768;
  int64_t chunks = 1;      // equal chunks per sequence
  bool recompute = false;  // keep layer inputs, not stashes (what lets one GPU hold a long sequence)
  int warmup_steps = 1, steps = 5;
  double lr = 1e-4;  // a real update, so that the timed steps are real training steps
};

// Seconds of one step and of its phases.
struct StepPhases {
  double total = 0;
  double forward_backward = 0;  // zeroing the gradients, forward and backward
  double grad_norm = 0;         // the global gradient norm
  double update = 0;            // clipping, AdamW, the bf16 re-cast
};

struct TrainStepBenchResult {
  std::vector<StepPhases> steps;  // the timed steps
  std::vector<double> losses;     // of the timed steps
  MemorySnapshot tracked;         // the stage's tracker over all steps: peak requested bytes by category
  int64_t allocator_reserved = 0; // our caching allocator's device bytes after the steps (in use + cached)
  int64_t driver_used_before = 0; // the driver's bytes in use before the model was built
  int64_t driver_used_peak = 0;   // the most the driver reported in use after any step
};

// Throws when a loss or gradient norm is not finite.
TrainStepBenchResult bench_training_steps(const TrainStepBenchOptions& o);

}  // namespace stateflow
