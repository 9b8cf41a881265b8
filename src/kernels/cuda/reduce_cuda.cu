#include "kernels/cuda/reduce_cuda.h"

#include <algorithm>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/levers.h"

namespace stateflow {
namespace {

constexpr int kThreads = 128;
constexpr int kAhead = 8;  // partials one thread loads before adding them

// Each block's segments, summed in ascending order from 0, into the block's first segment
// (parallel over blocks and columns). The loads of Ahead segments are issued before they are
// added: a short chunk has few blocks, so few threads, and a walk of one memory latency per
// segment (256 segments for a gated norm's block) was most of the norm backward's time there.
// Ahead = 1 is the walk before this lever (STATEFLOW_LEVERS_OFF=reduce_ahead); same sums.
template <int Ahead>
__global__ void sum_segments_kernel(float* partials, int64_t batch, int64_t blocks, int64_t seq_stride, int64_t segs,
                                    int64_t width) {
  const int64_t n = batch * blocks * width;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = e % width, k = (e / width) % blocks, b = e / (width * blocks);
    float* p = partials + (b * seq_stride + k) * segs * width + j;
    p[0] = cuda::add_in_order<Ahead>(0.f, segs, [&](int64_t q) { return p[q * width]; });
  }
}

// One thread per column walks the blocks in the fixed order (that is the point: one chain of
// additions); it loads kAhead blocks' values before adding them, so the walk is not one
// memory latency per block.
__global__ void add_blocks_in_order_kernel(const float* partials, int64_t batch, int64_t blocks, int64_t seq_stride,
                                           int64_t segs, int64_t width, float* out) {
  const int64_t j = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (j >= width) return;
  const int64_t n = batch * blocks;  // walk step w: block blocks - 1 - w / batch of sequence batch - 1 - w % batch
  auto at = [&](int64_t w) {
    const int64_t k = blocks - 1 - w / batch, b = batch - 1 - w % batch;
    return partials[(b * seq_stride + k) * segs * width + j];
  };
  out[j] = cuda::add_in_order<kAhead>(out[j], n, at);
}

}  // namespace

void add_token_block_partials_cuda(float* partials, int64_t batch, int64_t blocks, int64_t seq_stride, int64_t segs,
                                   int64_t width, float* out, cudaStream_t stream) {
  if (width == 0 || batch == 0 || blocks == 0) return;
  if (segs > 1) {
    const int64_t n = batch * blocks * width;
    const unsigned grid = unsigned(std::min<int64_t>((n + 255) / 256, 65536));
    if (lever_off("reduce_ahead"))
      sum_segments_kernel<1><<<grid, 256, 0, stream>>>(partials, batch, blocks, seq_stride, segs, width);
    else
      sum_segments_kernel<kAhead><<<grid, 256, 0, stream>>>(partials, batch, blocks, seq_stride, segs, width);
    cuda_check_launch("sum_segments_kernel");
  }
  add_blocks_in_order_kernel<<<unsigned((width + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      partials, batch, blocks, seq_stride, segs, width, out);
  cuda_check_launch("add_blocks_in_order_kernel");
}

}  // namespace stateflow
