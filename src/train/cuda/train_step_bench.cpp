#include "train/cuda/train_step_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "kernels/cuda/cuda_backend.h"
#include "pipeline/chunking.h"
#include "pipeline/launch.h"
#include "train/data.h"

namespace stateflow {

TrainStepBenchResult bench_training_steps(const TrainStepBenchOptions& o) {
  SF_CHECK(o.steps >= 1 && o.warmup_steps >= 0, "training-step bench: steps must be >= 1 and warm-up steps >= 0");
  init_cuda_backend();
  TrainStepBenchResult r;
  r.driver_used_before = device_used_bytes();

  DataConfig dc;
  dc.vocab_size = o.model.vocab_size;
  auto data = make_data_source(dc);
  std::vector<Batch> batches;
  for (int i = 0; i < o.warmup_steps + o.steps; ++i) batches.push_back(data->next(o.batch, o.seq_len));

  PipelineConfig pc;
  pc.model = o.model;
  pc.dtype = DType::F32;
  pc.device = Device::CUDA;
  pc.chunk_lengths = even_chunk_lengths(o.seq_len, o.chunks);
  pc.recompute = o.recompute;
  auto pipe = make_pipeline(pc, "local");
  DeviceBackend& gpu = device_backend(Device::CUDA);

  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  for (int i = 0; i < o.warmup_steps + o.steps; ++i) {
    gpu.synchronize();
    const auto t0 = Clock::now();
    pipe->zero_grads();
    const double loss = pipe->forward_backward(batches[i]).loss;
    gpu.synchronize();
    const auto t1 = Clock::now();
    const double norm = pipe->grad_norm();  // a host value: the reduction has finished
    const auto t2 = Clock::now();
    SF_CHECK(std::isfinite(loss) && std::isfinite(norm), "training-step bench: step ", i + 1, " has loss ", loss,
             " and gradient norm ", norm);
    pipe->clip_and_update(o.lr, norm);
    gpu.synchronize();
    const auto t3 = Clock::now();
    r.driver_used_peak = std::max(r.driver_used_peak, device_used_bytes());
    if (i < o.warmup_steps) continue;
    r.steps.push_back({seconds(t0, t3), seconds(t0, t1), seconds(t1, t2), seconds(t2, t3)});
    r.losses.push_back(loss);
  }
  MemoryTracker& tracker = pipe->stages().front()->tracker();
  r.tracked = tracker.snapshot();
  const DeviceAllocator::Stats st = cuda_allocator_for(tracker).stats();
  r.allocator_reserved = st.in_use + st.cached;
  return r;
}

}  // namespace stateflow
