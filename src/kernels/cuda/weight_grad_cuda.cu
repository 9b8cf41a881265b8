#include "kernels/cuda/weight_grad_cuda.h"

#include <algorithm>
#include <type_traits>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/mma_tile.cuh"

namespace stateflow {
namespace {

using cuda::bf16;
using cuda::Lay;

constexpr int kStep = 64;  // tokens per step of the walk
static_assert(kStep == kTokenBlock, "the walk's steps are the token blocks of the reductions");
// A CTA computes a 128 x (64 WN) tile of dW with 2 x WN warps of 64 x 64, loading STAGES
// token steps ahead with cp.async. Wide tiles (WN = 4) halve the operand traffic per FLOP
// from L2; narrow ones (WN = 2) fill the GPU when dW has few tiles. Every dW entry sees the
// same mma.sync sequence either way, so both give the same bits.
template <int WN>
struct Shape {
  static constexpr int tile_m = 128, tile_n = 64 * WN, threads = 64 * WN, stages = WN == 4 ? 4 : 3;
  using XTile = cuda::Tile<kStep, tile_m>;   // [token][in]: dW's rows are x's columns (Lay::Col)
  using DyTile = cuda::Tile<kStep, tile_n>;  // [token][out]                        (Lay::Row)
  static constexpr int stage_bytes = XTile::bytes + DyTile::bytes, smem_bytes = stages * stage_bytes;
};

template <class In>
struct Args {
  WeightGradOperands<In> ops;
  float* dW;
  int64_t batch, len, in, out, steps;
};

// Step s of the walk: block position k = blocks - 1 - s / batch of sequence b = batch - 1 - s % batch,
// tokens [t0, t0 + n).
struct Step {
  int64_t b, t0;
  int n;
};
__device__ Step step_at(int64_t s, int64_t batch, int64_t len) {
  const int64_t blocks = (len + kStep - 1) / kStep, k = blocks - 1 - s / batch;
  return {batch - 1 - s % batch, k * kStep, int(min(int64_t(kStep), len - k * kStep))};
}

// Rows [0, n) and columns [c0, c0 + cols) ∩ [0, width) of g (row stride ld) into a tile; zeros elsewhere.
template <int NT, class T>
__device__ void load_step(T tile, const bf16* g, int64_t ld, int n, int64_t c0, int64_t width, int tid) {
  constexpr int chunks = T::cols / 8;
  for (int i = tid; i < T::rows * chunks; i += NT) {
    const int r = i / chunks, c = (i % chunks) * 8;
    const bool ok = r < n && c0 + c < width;
    cuda::cp_async16(tile.at(r, c), ok ? g + r * ld + c0 + c : g, ok);
  }
}

template <int WN>
__global__ void __launch_bounds__(Shape<WN>::threads, WN == 4 ? 1 : 2) weight_grad_mma_kernel(Args<bf16> a) {
  using S = Shape<WN>;
  constexpr int kStages = S::stages;
  extern __shared__ __align__(16) unsigned char smem[];
  const int tid = threadIdx.x, warp = tid / 32;
  const int64_t m0 = int64_t(blockIdx.x) * S::tile_m, n0 = int64_t(blockIdx.y) * S::tile_n;
  const int wm = (warp / WN) * 64, wn = (warp % WN) * 64;
  auto x_tile = [&](int st) { return typename S::XTile{reinterpret_cast<bf16*>(smem + st * S::stage_bytes)}; };
  auto dy_tile = [&](int st) {
    return typename S::DyTile{reinterpret_cast<bf16*>(smem + st * S::stage_bytes + S::XTile::bytes)};
  };
  auto load = [&](int64_t s) {
    const Step p = step_at(s, a.batch, a.len);
    const int st = int(s % kStages);
    load_step<S::threads>(x_tile(st), a.ops.x + p.b * a.ops.x_seq_stride + p.t0 * a.ops.ldx, a.ops.ldx, p.n, m0,
                          a.in, tid);
    load_step<S::threads>(dy_tile(st), a.ops.dy + p.b * a.ops.dy_seq_stride + p.t0 * a.ops.ldy, a.ops.ldy, p.n, n0,
                          a.out, tid);
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < a.steps) load(s);
    cuda::cp_async_commit();
  }
  cuda::Frag<64, 64> acc;  // starts from dW: the walk continues the previous calls' sums
  acc.each_pair([&](int r, int c, float& v0, float& v1) {
    const int64_t i = m0 + wm + r, j = n0 + wn + c;  // out is a multiple of 8: pairs are whole
    const float2 d = i < a.in && j < a.out ? *reinterpret_cast<const float2*>(a.dW + i * a.out + j) : float2{0.f, 0.f};
    v0 = d.x, v1 = d.y;
  });
  for (int64_t s = 0; s < a.steps; ++s) {
    cuda::cp_async_wait<kStages - 2>();
    __syncthreads();  // step s has landed for all threads, and step s - 1's stage is free
    const int st = int(s % kStages);
    cuda::mma_acc<kStep, Lay::Col, Lay::Row>(acc, x_tile(st), wm, dy_tile(st), wn);
    if (s + kStages - 1 < a.steps) load(s + kStages - 1);
    cuda::cp_async_commit();
  }
  acc.each_pair([&](int r, int c, float& v0, float& v1) {
    const int64_t i = m0 + wm + r, j = n0 + wn + c;
    if (i < a.in && j < a.out) *reinterpret_cast<float2*>(a.dW + i * a.out + j) = float2{v0, v1};
  });
}

// Plain path: the partial sum of each token step (tokens ascending, from 0) for steps
// [s0, s0 + n) of the walk, one thread per (step, dW row i, kPlainCols columns j), i fastest
// (coalesced x loads; each x value serves kPlainCols columns). Step s0 + g goes to
// partial[n - 1 - g], so add_token_block_partials_cuda, which walks its blocks from the last
// index down, adds them in walk order.
constexpr int kPlainCols = 8;

template <class In>
__global__ void weight_grad_partials_kernel(Args<In> a, int64_t s0, int64_t n, float* partial) {
  const int64_t entries = a.in * a.out, col_groups = (a.out + kPlainCols - 1) / kPlainCols;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n * col_groups * a.in;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e % a.in, j0 = (e / a.in) % col_groups * kPlainCols, g = e / (a.in * col_groups);
    const int cols = int(min(int64_t(kPlainCols), a.out - j0));
    const Step p = step_at(s0 + g, a.batch, a.len);
    const In* x = a.ops.x + p.b * a.ops.x_seq_stride + p.t0 * a.ops.ldx + i;
    const In* dy = a.ops.dy + p.b * a.ops.dy_seq_stride + p.t0 * a.ops.ldy + j0;
    float sum[kPlainCols] = {};
    for (int t = 0; t < p.n; ++t) {
      const float xv = cuda::to_f32(x[t * a.ops.ldx]);
#pragma unroll
      for (int c = 0; c < kPlainCols; ++c)
        if (c < cols) sum[c] += xv * cuda::to_f32(dy[t * a.ops.ldy + c]);
    }
    float* out = partial + (n - 1 - g) * entries + i * a.out + j0;
#pragma unroll
    for (int c = 0; c < kPlainCols; ++c)
      if (c < cols) out[c] = sum[c];
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <int WN>
void launch_mma(const Args<bf16>& a, cudaStream_t stream) {
  using S = Shape<WN>;
  SF_CHECK((a.out + S::tile_n - 1) / S::tile_n <= 65535, "weight_grad_cuda: out = ", a.out,
           " is too wide for one launch");
  cuda_check(cudaFuncSetAttribute(weight_grad_mma_kernel<WN>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  S::smem_bytes),
             "cudaFuncSetAttribute (weight_grad_mma_kernel)");
  const dim3 grid(unsigned((a.in + S::tile_m - 1) / S::tile_m), unsigned((a.out + S::tile_n - 1) / S::tile_n));
  weight_grad_mma_kernel<WN><<<grid, S::threads, S::smem_bytes, stream>>>(a);
  cuda_check_launch("weight_grad_mma_kernel");
}

int sm_count() {
  int device = 0, n = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  cuda_check(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  return n;
}

// Whether every 8-element run the tensor-core kernel loads is 16-byte aligned.
template <class In>
bool mma_loads_ok(const WeightGradOperands<In>& o, int64_t in, int64_t out) {
  if constexpr (!std::is_same_v<In, bf16>) {
    return false;
  } else {
    const int64_t sizes[] = {in, out, o.ldx, o.ldy, o.x_seq_stride, o.dy_seq_stride};
    for (int64_t v : sizes)
      if (v % 8 != 0) return false;
    return aligned16(o.x) && aligned16(o.dy);
  }
}

}  // namespace

template <class In>
void weight_grad_cuda(const WeightGradOperands<In>& ops, float* dW, int64_t batch, int64_t len, int64_t in,
                      int64_t out, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                      WeightGradTile tile) {
  SF_CHECK(batch >= 0 && len >= 0 && in >= 0 && out >= 0, "weight_grad_cuda: negative size (batch ", batch,
           ", len ", len, ", in ", in, ", out ", out, ")");
  if (batch == 0 || len == 0 || in == 0 || out == 0) return;
  const Args<In> a{ops, dW, batch, len, in, out, batch * token_blocks(len)};
  if constexpr (std::is_same_v<In, bf16>) {
    if (mma_loads_ok(ops, in, out) && reinterpret_cast<uintptr_t>(dW) % 8 == 0) {
      if (tile == WeightGradTile::Auto)  // wide tiles when they still give nearly every SM one
        tile = (in + 127) / 128 * ((out + 255) / 256) * 10 >= sm_count() * 9 ? WeightGradTile::Wide
                                                                                : WeightGradTile::Narrow;
      if (tile == WeightGradTile::Wide) launch_mma<4>(a, stream);
      else launch_mma<2>(a, stream);
      return;
    }
  }
  // As many steps' partials at a time as the workspace holds, the walk's first steps first.
  const int64_t entries = in * out, group = int64_t(workspace_bytes / sizeof(float)) / entries;
  SF_CHECK(group >= 1 && workspace != nullptr, "weight_grad_cuda: ", in, " x ", out,
           " fp32 partial sums do not fit the ", workspace_bytes, "-byte workspace; give a larger one");
  auto* partial = static_cast<float*>(workspace);
  for (int64_t s0 = 0; s0 < a.steps; s0 += group) {
    const int64_t n = std::min(group, a.steps - s0);
    const int64_t threads = n * ((out + kPlainCols - 1) / kPlainCols) * in;
    const int64_t blocks = std::min<int64_t>((threads + 255) / 256, 65536);
    weight_grad_partials_kernel<In><<<unsigned(blocks), 256, 0, stream>>>(a, s0, n, partial);
    cuda_check_launch("weight_grad_partials_kernel");
    add_token_block_partials_cuda(partial, 1, n, n, 1, entries, dW, stream);
  }
}

template void weight_grad_cuda<float>(const WeightGradOperands<float>&, float*, int64_t, int64_t, int64_t, int64_t,
                                      void*, size_t, cudaStream_t, WeightGradTile);
template void weight_grad_cuda<bf16>(const WeightGradOperands<bf16>&, float*, int64_t, int64_t, int64_t, int64_t,
                                     void*, size_t, cudaStream_t, WeightGradTile);

}  // namespace stateflow
