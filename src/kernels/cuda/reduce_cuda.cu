#include "kernels/cuda/reduce_cuda.h"

#include <algorithm>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/levers.h"

namespace stateflow {
namespace {

constexpr int kThreads = 128;
// Partials one thread loads before adding them. Both walks are chains whose order is the
// result, so the only way to shorten them is fewer memory latencies per value: a 2K-token
// chunk's gated-norm block holds 256 segments, a 32K sequence 512 blocks, i.e. 32 or 64
// latencies a chain at 8 ahead, 8 or 16 at 32 (STATEFLOW_LEVERS_OFF=reduce_deep: 8 ahead).
constexpr int kAhead = 32, kOldAhead = 8;

// The gradients of one launch, side by side: gradient i owns columns [start[i], start[i + 1]).
// A kernel takes it as a __grid_constant__ parameter (no per-thread copy).
struct SumGroup {
  TokenBlockSum sum[kMaxBlockSums];
  int64_t start[kMaxBlockSums + 1];
  int n;
};

// Gradient i and its column j of the group's column col.
__device__ inline const TokenBlockSum& locate(const SumGroup& g, int64_t col, int64_t& j) {
  int i = 0;
  while (i + 1 < g.n && col >= g.start[i + 1]) ++i;
  j = col - g.start[i];
  return g.sum[i];
}

// Each block's segments, summed in ascending order from 0, into the block's first segment
// (parallel over blocks and columns). The loads of Ahead segments are issued before they are
// added: a short chunk has few blocks, so few threads, and a walk of one memory latency per
// segment (256 segments for a gated norm's block) was most of the norm backward's time there.
// Ahead = 1 is the walk before the reduce_ahead lever; same sums at any Ahead.
template <int Ahead>
__global__ void sum_segments_kernel(const __grid_constant__ SumGroup g, int64_t batch, int64_t blocks,
                                    int64_t seq_stride, int64_t segs) {
  const int64_t width = g.start[g.n], n = batch * blocks * width;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t col = e % width, k = (e / width) % blocks, b = e / (width * blocks);
    int64_t j;
    const TokenBlockSum& s = locate(g, col, j);
    float* p = s.partials + (b * seq_stride + k) * segs * s.width + j;
    p[0] = cuda::add_in_order<Ahead>(0.f, segs, [&](int64_t q) { return p[q * s.width]; });
  }
}

// One thread per column walks the blocks in the fixed order (that is the point: one chain of
// additions); it loads Ahead blocks' values before adding them, so the walk is not one
// memory latency per block.
template <int Ahead>
__global__ void add_blocks_in_order_kernel(const __grid_constant__ SumGroup g, int64_t batch, int64_t blocks,
                                           int64_t seq_stride, int64_t segs) {
  const int64_t col = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (col >= g.start[g.n]) return;
  int64_t j;
  const TokenBlockSum& s = locate(g, col, j);
  const int64_t n = batch * blocks;  // walk step w: block blocks - 1 - w / batch of sequence batch - 1 - w % batch
  auto at = [&](int64_t w) {
    const int64_t k = blocks - 1 - w / batch, b = batch - 1 - w % batch;
    return s.partials[(b * seq_stride + k) * segs * s.width + j];
  };
  s.out[j] = cuda::add_in_order<Ahead>(s.out[j], n, at);
}

}  // namespace

void add_token_block_partials_group_cuda(const TokenBlockSum* sums, int n, int64_t batch, int64_t blocks,
                                         int64_t seq_stride, int64_t segs, cudaStream_t stream) {
  SF_CHECK(n >= 0 && n <= kMaxBlockSums, "add_token_block_partials_group_cuda: ", n, " gradients; at most ",
           kMaxBlockSums, " in one launch");
  if (n > 1 && lever_off("reduce_group")) {  // one gradient a launch, as before the lever
    for (int i = 0; i < n; ++i) add_token_block_partials_group_cuda(sums + i, 1, batch, blocks, seq_stride, segs, stream);
    return;
  }
  SumGroup g{};
  for (int i = 0; i < n; ++i)
    if (sums[i].width > 0) g.sum[g.n] = sums[i], g.start[g.n + 1] = g.start[g.n] + sums[i].width, ++g.n;
  const int64_t width = g.start[g.n];
  if (width == 0 || batch == 0 || blocks == 0) return;
  const bool deep = !lever_off("reduce_deep");
  if (segs > 1) {
    const int64_t m = batch * blocks * width;
    const unsigned grid = unsigned(std::min<int64_t>((m + 255) / 256, 65536));
    if (lever_off("reduce_ahead")) sum_segments_kernel<1><<<grid, 256, 0, stream>>>(g, batch, blocks, seq_stride, segs);
    else if (!deep) sum_segments_kernel<kOldAhead><<<grid, 256, 0, stream>>>(g, batch, blocks, seq_stride, segs);
    else sum_segments_kernel<kAhead><<<grid, 256, 0, stream>>>(g, batch, blocks, seq_stride, segs);
    cuda_check_launch("sum_segments_kernel");
  }
  const unsigned grid = unsigned((width + kThreads - 1) / kThreads);
  if (deep) add_blocks_in_order_kernel<kAhead><<<grid, kThreads, 0, stream>>>(g, batch, blocks, seq_stride, segs);
  else add_blocks_in_order_kernel<kOldAhead><<<grid, kThreads, 0, stream>>>(g, batch, blocks, seq_stride, segs);
  cuda_check_launch("add_blocks_in_order_kernel");
}

void add_token_block_partials_cuda(float* partials, int64_t batch, int64_t blocks, int64_t seq_stride, int64_t segs,
                                   int64_t width, float* out, cudaStream_t stream) {
  const TokenBlockSum sum{partials, width, out};
  add_token_block_partials_group_cuda(&sum, 1, batch, blocks, seq_stride, segs, stream);
}

}  // namespace stateflow
