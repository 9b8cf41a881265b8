#include "kernels/cuda/reduce_cuda.h"

#include "kernels/cuda/cuda_check.h"

namespace stateflow {
namespace {

constexpr int kThreads = 128;  // one column per thread: coalesced rows of partials

// The walk over the blocks is sequential per column (that is the point: one fixed order of
// additions); the loads do not depend on the sum, so they run ahead of it.
__global__ void add_token_block_partials_kernel(const float* partials, int64_t batch, int64_t blocks,
                                                int64_t seq_stride, int64_t segs, int64_t width, float* out) {
  const int64_t j = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (j >= width) return;
  float acc = out[j];
  for (int64_t k = blocks - 1; k >= 0; --k)
    for (int64_t b = batch - 1; b >= 0; --b) {
      const float* p = partials + (b * seq_stride + k) * segs * width + j;
      float s = 0.f;
      for (int64_t q = 0; q < segs; ++q) s += p[q * width];
      acc += s;
    }
  out[j] = acc;
}

}  // namespace

void add_token_block_partials_cuda(const float* partials, int64_t batch, int64_t blocks, int64_t seq_stride,
                                   int64_t segs, int64_t width, float* out, cudaStream_t stream) {
  if (width == 0 || batch == 0 || blocks == 0) return;
  add_token_block_partials_kernel<<<unsigned((width + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      partials, batch, blocks, seq_stride, segs, width, out);
  cuda_check_launch("add_token_block_partials_kernel");
}

}  // namespace stateflow
