// How a run's --transport is resolved: auto picks nccl for GPU runs with a GPU per stage (one
// process) or under a launcher (one process per GPU), else local; explicit choices stand;
// nccl on the CPU and unknown names fail naming the fix.
#include "pipeline/launch.h"

#include <gtest/gtest.h>

#include "test_util.h"

using namespace stateflow;
using namespace stateflow::testing;

TEST(Launch, AutoPicksNcclOnlyWhenTheGpusSuffice) {
  EXPECT_EQ(choose_transport("auto", Device::CPU, 4, 8, 0).name, "local");
  EXPECT_EQ(choose_transport("auto", Device::CUDA, 1, 8, 0).name, "local");
  EXPECT_EQ(choose_transport("auto", Device::CUDA, 2, 2, 0).name, "nccl");
  EXPECT_EQ(choose_transport("auto", Device::CUDA, 4, 8, 0).name, "nccl");
  const TransportChoice few = choose_transport("auto", Device::CUDA, 4, 2, 0);
  EXPECT_EQ(few.name, "local");
  EXPECT_NE(few.why.find("only 2 GPU(s) for 4 stages"), std::string::npos) << few.why;
  EXPECT_NE(choose_transport("auto", Device::CUDA, 2, 0, 0).why.find("no NCCL"), std::string::npos);
  const TransportChoice launched = choose_transport("auto", Device::CUDA, 2, 1, 2);
  EXPECT_EQ(launched.name, "nccl") << "one process per GPU needs one GPU per process only";
  EXPECT_NE(launched.why.find("launcher started 2 ranks"), std::string::npos) << launched.why;
}

TEST(Launch, ExplicitChoicesStand) {
  for (const char* t : {"local", "mpi", "nccl"}) {
    const TransportChoice c = choose_transport(t, Device::CUDA, 4, 1, 0);
    EXPECT_EQ(c.name, t);
    EXPECT_EQ(c.why, "") << "only auto explains itself";
  }
}

TEST(Launch, NcclNeedsTheGpuAndUnknownNamesFail) {
  PipelineConfig pc;
  pc.model.pattern = "GG";
  pc.stages = 2;
  pc.chunk_lengths = {8};
  expect_error([&] { make_pipeline(pc, "nccl"); }, "use --device cuda");
  expect_error([&] { make_pipeline(pc, "carrier-pigeon"); }, "use auto, local");
}
