// stream_wait_geq (kernels/cuda/stream_wait_cuda.h): a stream queued behind a wait on a word runs
// its work only once a kernel on another stream has counted up to the value, and sees what that
// kernel wrote before counting (the publishing pattern of the GDN overlap: stores, a block barrier,
// one thread's fence and atomicAdd).
#include <gtest/gtest.h>

#include <vector>

#include "cuda_test_util.h"
#include "kernels/cuda/stream_wait_cuda.h"

namespace stateflow {
namespace {

using namespace testing;

// Each block spins a while (so that the waiting stream reaches its wait first), writes its part of
// data, and counts itself done in *word.
__global__ void write_then_count(int* data, int n_per_block, int64_t spin_cycles, unsigned* word) {
  const int64_t start = clock64();
  while (clock64() - start < spin_cycles) {
  }
  for (int i = threadIdx.x; i < n_per_block; i += blockDim.x) data[blockIdx.x * n_per_block + i] = blockIdx.x * 7 + i;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(word, 1u);
  }
}

__global__ void copy_ints(const int* src, int* dst, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) dst[i] = src[i];
}

TEST(StreamWaitCuda, WorkBehindAWaitSeesWhatTheCountingKernelWrote) {
  SKIP_WITHOUT_GPU();
  ASSERT_TRUE(stream_wait_available()) << "stream memory operations (cuStreamWaitValue32) unavailable here";
  constexpr int blocks = 64, per_block = 4096, n = blocks * per_block;
  Dev<int> data(n), copy(n);
  Dev<unsigned> word(1);
  ASSERT_EQ(cudaMemset(data.p, 0xff, n * sizeof(int)), cudaSuccess);  // -1 everywhere: what no block writes
  ASSERT_EQ(cudaMemset(word.p, 0, sizeof(unsigned)), cudaSuccess);
  cudaStream_t writer = nullptr, reader = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&writer, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&reader, cudaStreamNonBlocking), cudaSuccess);
  write_then_count<<<blocks, 256, 0, writer>>>(data.p, per_block, int64_t(1) << 22, word.p);  // queued first
  stream_wait_geq(reader, word.p, blocks);
  copy_ints<<<132, 256, 0, reader>>>(data.p, copy.p, n);
  ASSERT_EQ(cudaStreamSynchronize(reader), cudaSuccess);
  std::vector<int> want(n);
  for (int b = 0; b < blocks; ++b)
    for (int i = 0; i < per_block; ++i) want[size_t(b) * per_block + i] = b * 7 + i;
  EXPECT_TRUE(bitwise_equal(copy.raw(), want));
  ASSERT_EQ(cudaStreamSynchronize(writer), cudaSuccess);
  cudaStreamDestroy(writer), cudaStreamDestroy(reader);
}

// A wait whose value the word already holds (cyclic >=, as the driver compares) does not block.
TEST(StreamWaitCuda, AWaitAlreadyMetPasses) {
  SKIP_WITHOUT_GPU();
  ASSERT_TRUE(stream_wait_available());
  Dev<unsigned> word(1);
  const unsigned value = 5;
  ASSERT_EQ(cudaMemcpy(word.p, &value, sizeof(value), cudaMemcpyHostToDevice), cudaSuccess);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  for (unsigned v : {0u, 3u, 5u}) stream_wait_geq(s, word.p, v);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  cudaStreamDestroy(s);
}

}  // namespace
}  // namespace stateflow
