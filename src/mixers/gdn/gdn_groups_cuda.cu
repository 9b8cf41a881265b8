#include "mixers/gdn/gdn_groups_cuda.h"

#include <algorithm>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"

namespace stateflow {
namespace {

using cuda::bf16;

// Thread i owns 8 values of output row (r, h, j) (expand) or (r, h) (sum); n8 = outputs / 8.
template <class A>
__global__ void gdn_expand_groups_kernel(const A* x, A* y, int64_t n8, int64_t group, int64_t d8) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n8; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = i % d8, row = i / d8;  // row = (r * heads + h) * group + j
    float v[8];
    cuda::load8(x + ((row / group) * d8 + c) * 8, v);
    cuda::store8(y + i * 8, v);  // bf16 -> fp32 -> bf16 is exact
  }
}

template <class A>
__global__ void gdn_sum_groups_kernel(const A* dy, A* dx, int64_t n8, int64_t group, int64_t d8) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n8; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = i % d8, row = i / d8;  // row = r * heads + h
    float sum[8], v[8];
    cuda::load8(dy + (row * group * d8 + c) * 8, sum);
    for (int64_t j = 1; j < group; ++j) {
      cuda::load8(dy + ((row * group + j) * d8 + c) * 8, v);
#pragma unroll
      for (int e = 0; e < 8; ++e) sum[e] += v[e];
    }
    cuda::store8(dx + i * 8, sum);
  }
}

void check_shape(const char* name, const void* in, const void* out, int64_t rows, int64_t heads, int64_t group,
                 int64_t d) {
  SF_CHECK(rows >= 0 && heads >= 1 && group >= 1 && d >= 8 && d % 8 == 0, name, ": rows = ", rows, ", heads = ",
           heads, ", group = ", group, ", d = ", d, ": needs heads, group >= 1 and d a multiple of 8");
  check_aligned16(in, name, "the input");
  check_aligned16(out, name, "the output");
}

unsigned grid_for(int64_t n8) { return unsigned(std::max<int64_t>(1, std::min<int64_t>((n8 + 255) / 256, 65536))); }

}  // namespace

template <class A>
void gdn_expand_groups_cuda(const A* x, A* y, int64_t rows, int64_t heads, int64_t group, int64_t d,
                            cudaStream_t stream) {
  check_shape("gdn_expand_groups_cuda", x, y, rows, heads, group, d);
  const int64_t n8 = rows * heads * group * d / 8;
  if (n8 == 0) return;
  gdn_expand_groups_kernel<<<grid_for(n8), 256, 0, stream>>>(x, y, n8, group, d / 8);
  cuda_check_launch("gdn_expand_groups_kernel");
}

template <class A>
void gdn_sum_groups_cuda(const A* dy, A* dx, int64_t rows, int64_t heads, int64_t group, int64_t d,
                         cudaStream_t stream) {
  check_shape("gdn_sum_groups_cuda", dy, dx, rows, heads, group, d);
  const int64_t n8 = rows * heads * d / 8;
  if (n8 == 0) return;
  gdn_sum_groups_kernel<<<grid_for(n8), 256, 0, stream>>>(dy, dx, n8, group, d / 8);
  cuda_check_launch("gdn_sum_groups_kernel");
}

#define SF_INSTANTIATE(A)                                                                                     \
  template void gdn_expand_groups_cuda<A>(const A*, A*, int64_t, int64_t, int64_t, int64_t, cudaStream_t);    \
  template void gdn_sum_groups_cuda<A>(const A*, A*, int64_t, int64_t, int64_t, int64_t, cudaStream_t);
SF_INSTANTIATE(float)
SF_INSTANTIATE(bf16)
#undef SF_INSTANTIATE

}  // namespace stateflow
