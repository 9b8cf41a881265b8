#include "kernels/cuda/norms_cuda.h"

#include <algorithm>
#include <type_traits>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/reduce_cuda.h"

namespace stateflow {
namespace {

using cuda::bf16;

enum class Norm { Rms, GatedRms, L2 };

constexpr int kWarpsPerBlock = 4;
constexpr int64_t kMaxBackwardWarps = 2048;  // fixed partial count: enough warps to fill an H200

template <class A>
struct NormArgs {
  const A *x = nullptr, *z = nullptr, *dy = nullptr;  // l2norm backward: x holds the forward output y
  const float *w = nullptr, *rstd_in = nullptr;
  A *y = nullptr, *dx = nullptr, *dz = nullptr;
  float *rstd_out = nullptr, *partial = nullptr;
  int64_t rows = 0, dim = 0;
  float eps = 0.f;
};

// Lane l of a warp owns the 8-wide column vectors l, l + 32, ..., (VPT of them) of its row.
template <int VPT>
struct Lanes {
  int lane;
  __device__ int64_t col(int j) const { return (int64_t(j) * 32 + lane) * 8; }
};

template <class A, int VPT, Norm K>
__global__ void norm_forward_kernel(NormArgs<A> a) {
  const Lanes<VPT> L{int(threadIdx.x % 32)};
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (row >= a.rows) return;
  const A* x = a.x + row * a.dim;
  float xv[VPT][8], ss = 0.f;
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    if (L.col(j) < a.dim) {
      cuda::load8(x + L.col(j), xv[j]);
#pragma unroll
      for (int e = 0; e < 8; ++e) ss += xv[j][e] * xv[j][e];
    }
  }
  ss = cuda::warp_sum(ss);
  const float r = 1.f / sqrtf(K == Norm::L2 ? ss + a.eps : ss / float(a.dim) + a.eps);
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const int64_t c = L.col(j);
    if (c >= a.dim) continue;
    float y[8], w[8], z[8];
    if constexpr (K != Norm::L2) cuda::load8(a.w + c, w);
    if constexpr (K == Norm::GatedRms) cuda::load8(a.z + row * a.dim + c, z);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      y[e] = xv[j][e] * r;
      if constexpr (K != Norm::L2) y[e] *= w[e];
      if constexpr (K == Norm::GatedRms) y[e] *= cuda::silu(z[e]);
    }
    cuda::store8(a.y + row * a.dim + c, y);
  }
  if (L.lane == 0) a.rstd_out[row] = r;
}

// Warp w of n_warps handles rows w, w + n_warps, ... in order. Two passes over each row
// (the second re-reads it from cache): the first forms the row's dot product, the second
// the gradients. RMS kinds leave the warp's dw sums in partial[w].
template <class A, int VPT, Norm K>
__global__ void norm_backward_kernel(NormArgs<A> a, int64_t n_warps) {
  const Lanes<VPT> L{int(threadIdx.x % 32)};
  const int64_t warp = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (warp >= n_warps) return;
  constexpr bool has_w = K != Norm::L2;
  float dw[VPT][8] = {};  // w is re-read per row (from L1) rather than held: registers go to dw
  for (int64_t row = warp; row < a.rows; row += n_warps) {
    const float r = a.rstd_in[row];
    const int64_t off = row * a.dim;
    float dot = 0.f;
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      const int64_t c = L.col(j);
      if (c >= a.dim) continue;
      float x[8], dy[8], z[8], w[8];
      cuda::load8(a.x + off + c, x), cuda::load8(a.dy + off + c, dy);
      if constexpr (K == Norm::GatedRms) cuda::load8(a.z + off + c, z);
      if constexpr (has_w) cuda::load8(a.w + c, w);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        if constexpr (K == Norm::L2) {
          dot += x[e] * dy[e];
        } else {
          float dn = dy[e] * w[e];
          if constexpr (K == Norm::GatedRms) dn *= cuda::silu(z[e]);
          dot += dn * (x[e] * r);
        }
      }
    }
    dot = cuda::warp_sum(dot);
    const float mean = dot / float(a.dim);
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      const int64_t c = L.col(j);
      if (c >= a.dim) continue;
      float x[8], dy[8], z[8], w[8], dx[8], dz[8];
      cuda::load8(a.x + off + c, x), cuda::load8(a.dy + off + c, dy);
      if constexpr (K == Norm::GatedRms) cuda::load8(a.z + off + c, z);
      if constexpr (has_w) cuda::load8(a.w + c, w);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        if constexpr (K == Norm::L2) {
          dx[e] = r * (dy[e] - x[e] * dot);
        } else {
          const float n = x[e] * r;
          float dn = dy[e] * w[e];
          if constexpr (K == Norm::GatedRms) {
            const float gate = cuda::silu(z[e]);
            dn *= gate;
            dz[e] = dy[e] * n * w[e] * cuda::silu_grad(z[e]);
            dw[j][e] += dy[e] * (n * gate);
          } else {
            dw[j][e] += dy[e] * n;
          }
          dx[e] = r * (dn - x[e] * r * mean);
        }
      }
      cuda::store8(a.dx + off + c, dx);
      if constexpr (K == Norm::GatedRms) cuda::store8(a.dz + off + c, dz);
    }
  }
  if constexpr (has_w) {
#pragma unroll
    for (int j = 0; j < VPT; ++j)
      if (L.col(j) < a.dim) cuda::store8(a.partial + warp * a.dim + L.col(j), dw[j]);
  }
}

// Calls fn with the vectors-per-lane count (a power of two) that covers dim columns.
template <class Fn>
void dispatch_vpt(const char* kernel, int64_t dim, Fn&& fn) {
  SF_CHECK(dim > 0 && dim % 8 == 0 && dim <= 4096, kernel, ": dim = ", dim,
           " must be a multiple of 8 and at most 4096 on the GPU");
  const int64_t nvec = dim / 8;
  if (nvec <= 32) fn(std::integral_constant<int, 1>{});
  else if (nvec <= 64) fn(std::integral_constant<int, 2>{});
  else if (nvec <= 128) fn(std::integral_constant<int, 4>{});
  else if (nvec <= 256) fn(std::integral_constant<int, 8>{});
  else fn(std::integral_constant<int, 16>{});
}

unsigned blocks_for_warps(int64_t warps) { return unsigned((warps + kWarpsPerBlock - 1) / kWarpsPerBlock); }

int64_t backward_warps(int64_t rows) { return std::min(rows, kMaxBackwardWarps); }

template <Norm K, class A>
void norm_forward(const char* name, const NormArgs<A>& a, cudaStream_t stream) {
  for (const void* p : {static_cast<const void*>(a.x), static_cast<const void*>(a.z),
                        static_cast<const void*>(a.w), static_cast<const void*>(a.y)})
    if (p) check_aligned16(p, name, "every row pointer");
  dispatch_vpt(name, a.dim, [&](auto vpt) {
    if (a.rows == 0) return;
    norm_forward_kernel<A, vpt.value, K><<<blocks_for_warps(a.rows), kWarpsPerBlock * 32, 0, stream>>>(a);
    cuda_check_launch(name);
  });
}

template <Norm K, class A>
void norm_backward(const char* name, NormArgs<A> a, float* dw, void* workspace, cudaStream_t stream) {
  for (const void* p : {static_cast<const void*>(a.x), static_cast<const void*>(a.z),
                        static_cast<const void*>(a.w), static_cast<const void*>(a.dy),
                        static_cast<const void*>(a.dx), static_cast<const void*>(a.dz)})
    if (p) check_aligned16(p, name, "every row pointer");
  dispatch_vpt(name, a.dim, [&](auto vpt) {
    if (a.rows == 0) return;
    const int64_t warps = K == Norm::L2 ? a.rows : backward_warps(a.rows);
    if (K != Norm::L2) {
      SF_CHECK(workspace != nullptr, name, ": workspace is null; allocate norm_backward_workspace_bytes(rows, dim)");
      a.partial = static_cast<float*>(workspace);
    }
    norm_backward_kernel<A, vpt.value, K><<<blocks_for_warps(warps), kWarpsPerBlock * 32, 0, stream>>>(a, warps);
    cuda_check_launch(name);
    if (K != Norm::L2) add_partial_sums_cuda(a.partial, warps, a.dim, dw, stream);
  });
}

}  // namespace

size_t norm_backward_workspace_bytes(int64_t rows, int64_t dim) {
  return size_t(backward_warps(rows)) * size_t(dim) * sizeof(float);
}

template <class A>
void rmsnorm_forward_cuda(const A* x, const float* w, A* y, float* rstd, int64_t rows, int64_t dim, double eps,
                          cudaStream_t stream) {
  NormArgs<A> a;
  a.x = x, a.w = w, a.y = y, a.rstd_out = rstd, a.rows = rows, a.dim = dim, a.eps = float(eps);
  norm_forward<Norm::Rms>("rmsnorm_forward_cuda", a, stream);
}

template <class A>
void rmsnorm_backward_cuda(const A* x, const float* w, const float* rstd, const A* dy, A* dx, float* dw,
                           int64_t rows, int64_t dim, void* workspace, cudaStream_t stream) {
  NormArgs<A> a;
  a.x = x, a.w = w, a.rstd_in = rstd, a.dy = dy, a.dx = dx, a.rows = rows, a.dim = dim;
  norm_backward<Norm::Rms>("rmsnorm_backward_cuda", a, dw, workspace, stream);
}

template <class A>
void gated_rmsnorm_forward_cuda(const A* x, const A* z, const float* w, A* y, float* rstd, int64_t rows,
                                int64_t dim, double eps, cudaStream_t stream) {
  NormArgs<A> a;
  a.x = x, a.z = z, a.w = w, a.y = y, a.rstd_out = rstd, a.rows = rows, a.dim = dim, a.eps = float(eps);
  norm_forward<Norm::GatedRms>("gated_rmsnorm_forward_cuda", a, stream);
}

template <class A>
void gated_rmsnorm_backward_cuda(const A* x, const A* z, const float* w, const float* rstd, const A* dy, A* dx,
                                 A* dz, float* dw, int64_t rows, int64_t dim, void* workspace, cudaStream_t stream) {
  NormArgs<A> a;
  a.x = x, a.z = z, a.w = w, a.rstd_in = rstd, a.dy = dy, a.dx = dx, a.dz = dz, a.rows = rows, a.dim = dim;
  norm_backward<Norm::GatedRms>("gated_rmsnorm_backward_cuda", a, dw, workspace, stream);
}

template <class A>
void l2norm_forward_cuda(const A* x, A* y, float* rstd, int64_t rows, int64_t dim, double eps, cudaStream_t stream) {
  NormArgs<A> a;
  a.x = x, a.y = y, a.rstd_out = rstd, a.rows = rows, a.dim = dim, a.eps = float(eps);
  norm_forward<Norm::L2>("l2norm_forward_cuda", a, stream);
}

template <class A>
void l2norm_backward_cuda(const A* y, const float* rstd, const A* dy, A* dx, int64_t rows, int64_t dim,
                          cudaStream_t stream) {
  NormArgs<A> a;
  a.x = y, a.rstd_in = rstd, a.dy = dy, a.dx = dx, a.rows = rows, a.dim = dim;
  norm_backward<Norm::L2>("l2norm_backward_cuda", a, nullptr, nullptr, stream);
}

#define SF_INSTANTIATE(A)                                                                                        \
  template void rmsnorm_forward_cuda<A>(const A*, const float*, A*, float*, int64_t, int64_t, double,           \
                                        cudaStream_t);                                                          \
  template void rmsnorm_backward_cuda<A>(const A*, const float*, const float*, const A*, A*, float*, int64_t,   \
                                         int64_t, void*, cudaStream_t);                                         \
  template void gated_rmsnorm_forward_cuda<A>(const A*, const A*, const float*, A*, float*, int64_t, int64_t,   \
                                              double, cudaStream_t);                                            \
  template void gated_rmsnorm_backward_cuda<A>(const A*, const A*, const float*, const float*, const A*, A*,    \
                                               A*, float*, int64_t, int64_t, void*, cudaStream_t);              \
  template void l2norm_forward_cuda<A>(const A*, A*, float*, int64_t, int64_t, double, cudaStream_t);           \
  template void l2norm_backward_cuda<A>(const A*, const float*, const A*, A*, int64_t, int64_t, cudaStream_t);
SF_INSTANTIATE(float)
SF_INSTANTIATE(bf16)
#undef SF_INSTANTIATE

}  // namespace stateflow
