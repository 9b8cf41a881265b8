// The bench's GPU memory hook: the driver's bytes in use per GPU follow a stage's device
// tensors, and releasing the stage's tracker hands its cached blocks back to the driver.
// Then the bench itself on the GPU: a chunk sweep whose rows all carry the driver's figure.
#include <gtest/gtest.h>

#include "core/tensor.h"
#include "cuda_test_util.h"
#include "kernels/cuda/cuda_backend.h"
#include "test_util.h"
#include "train/bench.h"
#include "train/device_memory.h"

namespace stateflow {
namespace {

TEST(DeviceMemory, DriverFigureFollowsTensorsAndReleasingTheTrackerReturnsTheCache) {
  SKIP_WITHOUT_GPU();
  init_cuda_backend();
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  const int64_t before = gpu_used_bytes().at(0);
  ASSERT_EQ(int(gpu_used_bytes().size()), count);
  const int64_t gib = int64_t(1) << 30;
  {
    MemoryTracker stage("stage under test");
    TrackerScope scope(stage);
    {
      Tensor t = Tensor::zeros({gib / 4}, DType::F32, MemCategory::Activations, Device::CUDA);
      EXPECT_GE(gpu_used_bytes()[0], before + gib - (64 << 20));
    }
    // Freed tensors stay cached by the allocator: the driver still counts them.
    EXPECT_GE(gpu_used_bytes()[0], before + gib - (64 << 20));
    device_backend(Device::CUDA).release_memory(stage);  // what ~Stage does
  }
  EXPECT_LT(gpu_used_bytes()[0], before + (64 << 20));
}

TEST(DeviceMemory, BenchOnTheGpuReportsTheDriverFigurePerRow) {
  SKIP_WITHOUT_GPU();
  init_cuda_backend();
  const uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE(seed);
  BenchOptions o;
  // Shapes the CUDA kernels support: GDN heads of 128, C = 64.
  o.model = testing::gpu_test_model(seed);
  o.data.seed = seed;
  o.device = Device::CUDA;
  o.batch = 2, o.seq_len = 256, o.stages = 2, o.microbatches = 2;
  o.warmup_steps = 1, o.steps = 1;
  o.chunk_sweep = {2, 4};
  BenchResult r = run_bench(o);
  ASSERT_EQ(r.rows.size(), 3u);
  int best = 0;
  for (const BenchRow& row : r.rows) {
    EXPECT_FALSE(row.oom) << row.oom_message;
    EXPECT_GT(row.tokens_per_s, 0);
    EXPECT_FALSE(row.gpu_used_bytes.empty());
    EXPECT_GT(row.gpu_used_bytes.at(0), row.stage_memory.at(0).total_peak);  // the context comes on top
    best += row.best;
  }
  EXPECT_EQ(best, 1);
}

}  // namespace
}  // namespace stateflow
