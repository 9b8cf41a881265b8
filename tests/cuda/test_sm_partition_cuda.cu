// --sm-split's SM partitions (kernels/cuda/sm_partition_cuda.h): threads in different parts of
// a GPU run their kernels on disjoint SM sets, each within its part; a thread outside any part
// has the whole GPU; parts that do not exist or do not fit are refused with an error.
#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/sm_partition_cuda.h"

namespace stateflow {
namespace {

// Each block notes the SM it ran on, after staying a while so that the blocks of a launch
// spread over every SM it may use.
__global__ void note_sm_kernel(unsigned* sm_of_block, unsigned long long stay_ns) {
  unsigned sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  while (t - t0 < stay_ns);
  if (threadIdx.x == 0) sm_of_block[blockIdx.x] = sm;
}

std::set<unsigned> sms_used(int blocks) {
  unsigned* d = nullptr;
  cuda_check(cudaMalloc(&d, sizeof(unsigned) * size_t(blocks)), "cudaMalloc");
  note_sm_kernel<<<blocks, 32>>>(d, 20000);
  cuda_check_launch("note_sm_kernel");
  std::vector<unsigned> h(static_cast<size_t>(blocks));
  cuda_check(cudaMemcpy(h.data(), d, sizeof(unsigned) * h.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
  cuda_check(cudaFree(d), "cudaFree");
  return {h.begin(), h.end()};
}

int gpu_sms() {
  int n = 0;
  cuda_check(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, 0), "cudaDeviceGetAttribute");
  return n;
}

TEST(SmPartitionCuda, ThreadsInDifferentPartsRunOnDisjointSmSets) {
  SKIP_WITHOUT_GPU();
  const int whole = gpu_sms();
  std::set<unsigned> used[2];
  int sms[2] = {0, 0};
  std::string error[2];
  std::vector<std::thread> threads;
  for (int p = 0; p < 2; ++p)
    threads.emplace_back([&, p] {
      try {
        cuda_check(cudaSetDevice(0), "cudaSetDevice");
        use_sm_partition(p, 2);
        sms[p] = sm_count_of_thread();
        used[p] = sms_used(8 * whole);
      } catch (const std::exception& e) {
        error[p] = e.what();
      }
    });
  for (std::thread& t : threads) t.join();
  ASSERT_EQ(error[0], "");
  ASSERT_EQ(error[1], "");
  std::printf("[ SM parts ] GPU of %d SMs: part 0 has %d and ran on %zu, part 1 has %d and ran on %zu (%s each)\n",
              whole, sms[0], used[0].size(), sms[1], used[1].size(), sm_partition_description(2).c_str());
  std::vector<unsigned> both;
  std::set_intersection(used[0].begin(), used[0].end(), used[1].begin(), used[1].end(), std::back_inserter(both));
  EXPECT_TRUE(both.empty()) << both.size() << " SMs ran work of both parts";
  for (int p = 0; p < 2; ++p) {
    EXPECT_GT(sms[p], 0);
    EXPECT_LE(2 * sms[p], whole) << "two parts hold at most the GPU";
    EXPECT_LE(int(used[p].size()), sms[p]) << "part " << p << " ran on SMs outside it";
    EXPECT_GE(2 * int(used[p].size()), sms[p]) << "part " << p << " left most of its SMs idle";
  }
  EXPECT_EQ(sm_count_of_thread(), whole) << "a thread that entered no part has the whole GPU";
}

TEST(SmPartitionCuda, PartsThatDoNotExistOrDoNotFitAreRefused) {
  SKIP_WITHOUT_GPU();
  std::string no_such_part, too_many;
  std::thread([&] {  // on a thread of its own: the calls must leave no part current here
    try {
      use_sm_partition(2, 2);
    } catch (const std::exception& e) {
      no_such_part = e.what();
    }
    try {
      use_sm_partition(0, gpu_sms());  // parts of one SM: below any GPU's smallest part
    } catch (const std::exception& e) {
      too_many = e.what();
    }
  }).join();
  EXPECT_NE(no_such_part.find("SM partition 2 of 2 does not exist"), std::string::npos) << no_such_part;
  EXPECT_NE(too_many.find("do not split into"), std::string::npos) << too_many;
  EXPECT_NE(too_many.find("use at most"), std::string::npos) << too_many;
}

}  // namespace
}  // namespace stateflow
