// Data parallelism on the GPU, what one GPU can run: the NCCL grid set-up (the world's
// communicator, its placement gather and its two splits) with one rank per group, and a stage
// summing its gradients over that one-rank group in several buckets, for two steps: the loss
// and gradients are bitwise those of the same stage without a group (a sum over one rank is
// the identity). When buckets start: tests/test_grad_reduce.cpp. Several GPUs:
// tests/nccl/data_parallel.sh.
// Skipped without a GPU or without NCCL in this build.
#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "cuda_test_util.h"
#include "kernels/cuda/cuda_backend.h"
#include "layer_testing.h"
#include "pipeline/local_transport.h"
#include "pipeline/stage.h"
#include "test_util.h"
#ifdef STATEFLOW_HAVE_NCCL
#include "pipeline/nccl_transport.h"
#endif

namespace stateflow {
namespace {

struct StepOut {
  double loss = 0;
  std::vector<std::vector<float>> grads;  // model order, on the host
};

StepOut run_step(Stage& s, const Batch& b) {
  s.zero_grads();
  StepOut out;
  out.loss = s.forward_backward(b).loss;
  for (Param* p : s.model().params()) {
    Tensor g = p->grad.to(Device::CPU);
    out.grads.emplace_back(g.data<float>(), g.data<float>() + g.numel());
  }
  return out;
}

TEST(DataParallelCuda, OneRankGroupsSetUpAndSumEveryBucket) {
  SKIP_WITHOUT_GPU();
#ifndef STATEFLOW_HAVE_NCCL
  GTEST_SKIP() << "this build has no NCCL (NCCL test skipped)";
#else
  init_cuda_backend();
  const uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  PipelineConfig pc;
  pc.model = testing::gpu_test_model(seed);
  pc.dtype = DType::F32;
  pc.device = Device::CUDA;
  pc.microbatches = 2;
  pc.chunk_lengths = {64, 64};
  pc.timeout_s = 20;
  pc.bucket_bytes = 256 << 10;  // several buckets for this model
  const Batch b = testing::random_batch(rng, 2, 128, pc.model.vocab_size);

  GridTransports g = make_nccl_grid_transports(0, 1, 0, 1, 0, 20, [](const std::string& id) { return id; });
  EXPECT_EQ(g.grid.stages, 1);
  EXPECT_EQ(g.grid.replicas, 1);
  ASSERT_EQ(g.places.size(), 1u);
  EXPECT_EQ(g.places[0].gpu, 0);
  EXPECT_FALSE(g.places[0].host.empty());
  ASSERT_TRUE(g.pipeline && g.group);
  EXPECT_EQ(g.pipeline->world_size(), 1);
  EXPECT_EQ(g.group->world_size(), 1);
  EXPECT_EQ(g.group->cuda_device(), 0);
  EXPECT_DOUBLE_EQ(g.group->all_reduce_sum(2.5), 2.5);

  StepOut with_group, without;
  size_t buckets = 0;
  {
    Stage s(pc, 0, *g.pipeline, g.group.get());
    ASSERT_NE(s.reducer(), nullptr);
    buckets = s.reducer()->buckets().size();
    std::set<Param*> covered;
    for (const GradBucket& k : s.reducer()->buckets()) covered.insert(k.params.begin(), k.params.end());
    EXPECT_EQ(covered.size(), s.model().params().size()) << "every parameter in one bucket";
    with_group = run_step(s, b);
    with_group = run_step(s, b);  // a second step reuses the reducer
  }
  {
    auto local = make_local_transports(1, 20);
    Stage s(pc, 0, *local[0]);
    without = run_step(s, b);
  }
  EXPECT_GT(buckets, 2u) << "the test wants several buckets";
  EXPECT_EQ(std::memcmp(&with_group.loss, &without.loss, sizeof(double)), 0)
      << with_group.loss << " vs " << without.loss;
  ASSERT_EQ(with_group.grads.size(), without.grads.size());
  for (size_t i = 0; i < without.grads.size(); ++i)
    EXPECT_TRUE(testing::bitwise_equal(with_group.grads[i], without.grads[i])) << "parameter " << i;
#endif
}

}  // namespace
}  // namespace stateflow
