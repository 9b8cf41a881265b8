#include "kernels/cuda/swiglu_cuda.h"

#include <algorithm>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"

namespace stateflow {
namespace {

using cuda::bf16;

// The 8-wide vectors, then the last n % 8 values one at a time (load1/store1 below).
template <class A>
__device__ void load1(const A* p, float (&v)[8]) {
  cuda::zero8(v);
  v[0] = cuda::to_f32(*p);
}
template <class A>
__device__ void store1(A* p, const float (&v)[8]) { *p = cuda::from_f32<A>(v[0]); }

// Where a, b, da and db hold value i of the [n / cols, cols] gate: i itself, or in rows ld apart.
struct GateCols {
  int64_t cols, ld;
  __device__ int64_t at(int64_t i) const { return ld > cols ? i / cols * ld + i % cols : i; }
};

template <class A>
__device__ void swiglu_forward_at(const A* a, const A* b, A* h, int64_t i, int64_t j, bool vec) {
  float av[8], bv[8], hv[8];
  vec ? cuda::load8(a + j, av) : load1(a + j, av);
  vec ? cuda::load8(b + j, bv) : load1(b + j, bv);
#pragma unroll
  for (int e = 0; e < 8; ++e) hv[e] = cuda::silu(av[e]) * bv[e];
  vec ? cuda::store8(h + i, hv) : store1(h + i, hv);
}

template <class A>
__device__ void swiglu_backward_at(const A* a, const A* b, const A* dh, A* da, A* db, int64_t i, int64_t j,
                                   bool vec) {
  float av[8], bv[8], gv[8], dav[8], dbv[8];
  vec ? cuda::load8(a + j, av) : load1(a + j, av);
  vec ? cuda::load8(b + j, bv) : load1(b + j, bv);
  vec ? cuda::load8(dh + i, gv) : load1(dh + i, gv);
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    dav[e] = gv[e] * bv[e] * cuda::silu_grad(av[e]);
    dbv[e] = gv[e] * cuda::silu(av[e]);
  }
  vec ? cuda::store8(da + j, dav) : store1(da + j, dav);
  vec ? cuda::store8(db + j, dbv) : store1(db + j, dbv);
}

// Work item k < n / 8 is the vector at 8k; the rest are the tail elements.
__device__ inline bool item(int64_t k, int64_t n, int64_t& i) {
  const int64_t nvec = n / 8;
  i = k < nvec ? 8 * k : 8 * nvec + (k - nvec);
  return k < nvec;
}

template <class A>
__global__ void swiglu_forward_kernel(const A* a, const A* b, A* h, int64_t n, GateCols g) {
  const int64_t items = n / 8 + n % 8;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < items; k += int64_t(gridDim.x) * blockDim.x) {
    int64_t i;
    const bool vec = item(k, n, i);
    swiglu_forward_at(a, b, h, i, g.at(i), vec);
  }
}

template <class A>
__global__ void swiglu_backward_kernel(const A* a, const A* b, const A* dh, A* da, A* db, int64_t n, GateCols g) {
  const int64_t items = n / 8 + n % 8;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < items; k += int64_t(gridDim.x) * blockDim.x) {
    int64_t i;
    const bool vec = item(k, n, i);
    swiglu_backward_at(a, b, dh, da, db, i, g.at(i), vec);
  }
}

unsigned grid_for(int64_t n) { return unsigned(std::min<int64_t>((n / 8 + n % 8 + 255) / 256, 65536)); }

// Whole vectors stay in one row when rows are apart (cols a multiple of 8, which tiles n).
GateCols gate_cols(const char* name, int64_t n, int64_t cols, int64_t ld) {
  SF_CHECK(ld <= cols || (cols > 0 && cols % 8 == 0 && ld % 8 == 0 && n % cols == 0), name, ": rows of ", cols,
           " values ", ld, " apart must be multiples of 8 that tile n = ", n);
  return {cols, ld};
}

}  // namespace

template <class A>
void swiglu_forward_cuda(const A* a, const A* b, A* h, int64_t n, cudaStream_t stream, int64_t cols, int64_t ld) {
  const GateCols g = gate_cols("swiglu_forward_cuda", n, cols, ld);
  for (const void* p : {static_cast<const void*>(a), static_cast<const void*>(b), static_cast<const void*>(h)})
    check_aligned16(p, "swiglu_forward_cuda", "a, b and h");
  if (n == 0) return;
  swiglu_forward_kernel<<<grid_for(n), 256, 0, stream>>>(a, b, h, n, g);
  cuda_check_launch("swiglu_forward_kernel");
}

template <class A>
void swiglu_backward_cuda(const A* a, const A* b, const A* dh, A* da, A* db, int64_t n, cudaStream_t stream,
                          int64_t cols, int64_t ld) {
  const GateCols g = gate_cols("swiglu_backward_cuda", n, cols, ld);
  for (const void* p : {static_cast<const void*>(a), static_cast<const void*>(b), static_cast<const void*>(dh),
                        static_cast<const void*>(da), static_cast<const void*>(db)})
    check_aligned16(p, "swiglu_backward_cuda", "a, b, dh, da and db");
  if (n == 0) return;
  swiglu_backward_kernel<<<grid_for(n), 256, 0, stream>>>(a, b, dh, da, db, n, g);
  cuda_check_launch("swiglu_backward_kernel");
}

template void swiglu_forward_cuda<float>(const float*, const float*, float*, int64_t, cudaStream_t, int64_t, int64_t);
template void swiglu_forward_cuda<bf16>(const bf16*, const bf16*, bf16*, int64_t, cudaStream_t, int64_t, int64_t);
template void swiglu_backward_cuda<float>(const float*, const float*, const float*, float*, float*, int64_t,
                                          cudaStream_t, int64_t, int64_t);
template void swiglu_backward_cuda<bf16>(const bf16*, const bf16*, const bf16*, bf16*, bf16*, int64_t, cudaStream_t,
                                         int64_t, int64_t);

}  // namespace stateflow
