#include "kernels/cuda/reduce_cuda.h"

#include "kernels/cuda/cuda_check.h"

namespace stateflow {
namespace {

constexpr int kCols = 32;    // columns per block (one warp wide: coalesced rows of partials)
constexpr int kGroups = 16;  // groups of parts per column; fixed, so the order never changes

__global__ void add_partial_sums_kernel(const float* partials, int64_t parts, int64_t width, float* out) {
  __shared__ float group_sum[kGroups][kCols];
  const int64_t j = int64_t(blockIdx.x) * kCols + threadIdx.x;
  const int64_t per_group = (parts + kGroups - 1) / kGroups;
  const int64_t p0 = threadIdx.y * per_group, p1 = min(parts, p0 + per_group);
  float s = 0.f;
  if (j < width)
    for (int64_t p = p0; p < p1; ++p) s += partials[p * width + j];
  group_sum[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && j < width) {
    float total = 0.f;
    for (int g = 0; g < kGroups; ++g) total += group_sum[g][threadIdx.x];
    out[j] += total;
  }
}

}  // namespace

void add_partial_sums_cuda(const float* partials, int64_t parts, int64_t width, float* out, cudaStream_t stream) {
  if (width == 0 || parts == 0) return;
  const dim3 block(kCols, kGroups), grid(unsigned((width + kCols - 1) / kCols));
  add_partial_sums_kernel<<<grid, block, 0, stream>>>(partials, parts, width, out);
  cuda_check_launch("add_partial_sums_kernel");
}

}  // namespace stateflow
