// The pipeline engine on GPUs: a step's loss (added up on the device, read once) is the one
// of the single-stage step on the same GPU; the timeline comes from device events and lies
// within the step; a destroyed pipeline gives its device memory back to the driver; and with
// two GPUs, a transport that places stage i on GPU i gets each stage's weights built there.
#include <gtest/gtest.h>

#include <chrono>

#include "cuda_test_util.h"
#include "kernels/cuda/cuda_backend.h"
#include "layer_testing.h"
#include "model/model.h"
#include "pipeline/local_transport.h"
#include "pipeline/pipeline.h"
#include "test_util.h"
#include "train/step.h"

namespace stateflow {
namespace {

using testing::fresh_seed;
using testing::random_batch;

// Shapes the CUDA kernels support: GDN heads of 128, C = 64, widths multiples of 8.
PipelineConfig gpu_pipeline(const ModelConfig& m, int M, std::vector<int64_t> lengths) {
  PipelineConfig pc;
  pc.model = m;
  pc.dtype = DType::F32;
  pc.device = Device::CUDA;
  pc.stages = 2, pc.microbatches = M, pc.chunk_lengths = std::move(lengths);
  return pc;
}

TEST(PipelineCuda, LossEqualsTheSingleStageStepOnTheSameGpu) {
  SKIP_WITHOUT_GPU();
  init_cuda_backend();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const ModelConfig cfg = testing::gpu_test_model(seed);
  const std::vector<int64_t> lengths{64, 128, 8};
  const Batch b = random_batch(rng, 2, 200, cfg.vocab_size);
  Model whole(cfg, DType::F32, 0, Model::num_layers_of(cfg), Device::CUDA);
  const StepLoss ref = forward_backward(whole, b, 2, lengths);
  auto pipe = make_local_pipeline(gpu_pipeline(cfg, 2, lengths));
  for (int step = 0; step < 2; ++step) {  // the device sums start from zero every step
    pipe->zero_grads();
    const PipelineStepResult r = pipe->forward_backward(b);
    std::printf("[ pipeline step %d vs single stage ] loss %.9g vs %.9g\n", step, r.loss, ref.loss);
    // The reference rounds each unit's loss to float before adding: 1e-6 covers that, while a
    // chunk counted twice or lost moves the loss by a third or more.
    EXPECT_NEAR(r.loss, ref.loss, 1e-6 * std::abs(ref.loss));
    EXPECT_NEAR(r.stats.loss_sum, ref.stats.loss_sum, 1e-12 * std::abs(ref.stats.loss_sum));
    EXPECT_EQ(r.stats.counted, ref.stats.counted);
    EXPECT_EQ(r.stats.correct, ref.stats.correct);
    for (const StageStepResult& s : r.stages) EXPECT_EQ(s.loss, r.loss) << "every stage reports the step's loss";
  }
}

// --sm-split: the stages run side by side on their own SMs, each with its own queue, so a tensor
// handed over must be complete before the receiver reads it and copied before the sender
// reuses its block. The loss and gradients are bitwise those of the stages taking turns.
TEST(PipelineCuda, SmSplitStagesGiveBitwiseTheStepOfStagesTakingTurns) {
  SKIP_WITHOUT_GPU();
  init_cuda_backend();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const ModelConfig cfg = testing::gpu_test_model(seed);
  const std::vector<int64_t> lengths{320, 64, 128, 512};
  const Batch b = random_batch(rng, 4, 1024, cfg.vocab_size);
  auto step = [&](bool split) {
    PipelineConfig pc = gpu_pipeline(cfg, 2, lengths);
    pc.split_sms = split;
    auto pipe = make_local_pipeline(pc);
    std::pair<double, double> out;
    for (int i = 0; i < 2; ++i) {  // the second step reuses the cached blocks the first freed
      pipe->zero_grads();
      out = {pipe->forward_backward(b).loss, pipe->grad_norm()};
    }
    return out;
  };
  const auto turns = step(false), split = step(true);
  std::printf("[ sm split vs turns ] loss %.17g vs %.17g, gradient norm %.17g vs %.17g\n", split.first, turns.first,
              split.second, turns.second);
  EXPECT_EQ(split.first, turns.first);
  EXPECT_EQ(split.second, turns.second);
}

TEST(PipelineCuda, TimelineComesFromTheGpuAndLiesWithinTheStep) {
  SKIP_WITHOUT_GPU();
  init_cuda_backend();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const ModelConfig cfg = testing::gpu_test_model(seed);
  auto pipe = make_local_pipeline(gpu_pipeline(cfg, 2, {192, 64, 200, 56}));
  const Batch b = random_batch(rng, 4, 512, cfg.vocab_size);
  for (int step = 0; step < 3; ++step) {  // the first steps also load kernels and fill caches
    pipe->zero_grads();
    const auto t0 = std::chrono::steady_clock::now();
    const PipelineStepResult r = pipe->forward_backward(b);
    const double host_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    SCOPED_TRACE("step " + std::to_string(step));
    double makespan = 0;
    for (const StageStepResult& s : r.stages) {
      ASSERT_FALSE(s.timeline.empty());
      double busy = 0, previous_end = 0;
      for (const TimedAction& a : s.timeline) {
        EXPECT_GE(a.start, 0.0);
        EXPECT_GE(a.end, a.start);
        EXPECT_GE(a.start, previous_end) << "a stage's actions follow one another on its stream";
        previous_end = a.end;
        if (is_compute(a.action)) busy += a.end - a.start;
      }
      EXPECT_NEAR(s.busy_s, busy, 1e-9) << "busy time is the compute actions' time";
      EXPECT_GT(s.busy_s, 0.0);
      EXPECT_LE(s.busy_s, s.wall_s);
      EXPECT_LE(previous_end, s.wall_s);
      // The device marks lie inside the host's view of the step; the host adds only the
      // line-up, the final synchronisation and the all-reduces of the results.
      EXPECT_LE(s.wall_s, host_s + 1e-4);
      // The host issued every action before the step's end, which waits for the device.
      EXPECT_GT(s.host_issue_s, 0.0);
      EXPECT_LE(s.host_issue_s, host_s);
      makespan = std::max(makespan, s.wall_s);
      if (step == 2) {
        EXPECT_GE(s.wall_s, 0.5 * host_s) << "wall " << s.wall_s << " s, host " << host_s << " s";
        std::printf("[ stage %d ] busy %.3f ms, wall %.3f ms, host step %.3f ms\n", s.timeline.front().action.stage,
                    1e3 * s.busy_s, 1e3 * s.wall_s, 1e3 * host_s);
      }
    }
    EXPECT_EQ(r.makespan_s, makespan);
  }
}

TEST(PipelineCuda, DestroyedPipelineGivesItsDeviceMemoryBack) {
  SKIP_WITHOUT_GPU();
  init_cuda_backend();
  // The stages (local transport: not placed) run on their threads' default GPU 0; the checks
  // below read the same GPU's allocators from this thread.
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const ModelConfig cfg = testing::gpu_test_model(seed, 4096);  // embedding and head: 4 MiB of fp32 each
  const PipelineConfig pc = gpu_pipeline(cfg, 1, {100, 28});
  const Batch b = random_batch(rng, 1, 128, cfg.vocab_size);
  auto run_one = [&](int64_t* tracked) {
    auto pipe = make_local_pipeline(pc);
    pipe->forward_backward(b);
    pipe->clip_and_update(1e-3, pipe->grad_norm());
    *tracked = 0;
    for (Stage* s : pipe->stages()) {
      *tracked += s->tracker().snapshot().total_current;
      EXPECT_GT(cuda_allocator_for(s->tracker()).stats().cached, 0) << "the step left blocks in the cache";
    }
  };
  int64_t tracked = 0;
  run_one(&tracked);  // loads the kernels (module memory stays), as a first run of a benchmark does
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const int allocators_before = cuda_allocator_count();
  const int64_t used_before = device_used_bytes();
  run_one(&tracked);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const int64_t used_after = device_used_bytes();
  std::printf("[ device memory ] a pipeline held %s tracked; driver used %s before, %s after it\n",
              format_bytes(tracked).c_str(), format_bytes(used_before).c_str(), format_bytes(used_after).c_str());
  EXPECT_EQ(cuda_allocator_count(), allocators_before) << "the stages' allocators outlived them";
  ASSERT_GT(tracked, int64_t(16) << 20) << "the test needs a pipeline larger than its tolerance";
  EXPECT_LE(used_after - used_before, int64_t(8) << 20) << "device memory of a destroyed pipeline stayed in use";
}

// The local transport, placing stage i on GPU i (as the NCCL transport does).
class PlacedTransport : public LocalTransport {
 public:
  using LocalTransport::LocalTransport;
  int cuda_device() const override { return rank(); }
};

TEST(PipelineCuda, TwoGpusBuildEachStagesWeightsOnItsOwnGpu) {
  SKIP_WITHOUT_GPU();
  int gpus = 0;
  ASSERT_EQ(cudaGetDeviceCount(&gpus), cudaSuccess);
  if (gpus < 2) GTEST_SKIP() << "needs 2 GPUs, this machine has " << gpus << " (GPU test skipped)";
  init_cuda_backend();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const PipelineConfig pc = gpu_pipeline(testing::gpu_test_model(seed), 1, {64});
  auto hub = std::make_shared<LocalHub>(2, pc.timeout_s);
  std::vector<std::unique_ptr<Transport>> endpoints;
  for (int r = 0; r < 2; ++r) endpoints.push_back(std::make_unique<PlacedTransport>(hub, r));
  hub.reset();
  Pipeline pipe(pc, std::move(endpoints));
  for (Stage* s : pipe.stages()) {
    ASSERT_FALSE(s->model().params().empty());
    for (Param* p : s->model().params())
      for (const Tensor* t : {&p->value, &p->grad}) {
        cudaPointerAttributes a{};
        ASSERT_EQ(cudaPointerGetAttributes(&a, t->raw()), cudaSuccess) << p->name;
        EXPECT_EQ(a.type, cudaMemoryTypeDevice) << p->name;
        EXPECT_EQ(a.device, s->rank()) << p->name << " of stage " << s->rank();
      }
  }
  // Kernels of each stage run on its GPU, from its thread: zeroing and the norm's reduction.
  pipe.zero_grads();
  EXPECT_EQ(pipe.grad_norm(), 0.0);
}

}  // namespace
}  // namespace stateflow
