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
// CTA tile 128 x 128 of dW, four warps of 64 x 64, three stages of cp.async loads in flight.
constexpr int kTileM = 128, kTileN = 128, kStages = 3, kThreads = 128;
using XTile = cuda::Tile<kStep, kTileM>;    // [token][in]: dW's rows are x's columns (Lay::Col)
using DyTile = cuda::Tile<kStep, kTileN>;   // [token][out]                        (Lay::Row)
constexpr int kStageBytes = XTile::bytes + DyTile::bytes;
constexpr int kSmemBytes = kStages * kStageBytes;

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
template <class T>
__device__ void load_step(T tile, const bf16* g, int64_t ld, int n, int64_t c0, int64_t width, int tid) {
  constexpr int chunks = T::cols / 8;
  for (int i = tid; i < T::rows * chunks; i += kThreads) {
    const int r = i / chunks, c = (i % chunks) * 8;
    const bool ok = r < n && c0 + c < width;
    cuda::cp_async16(tile.at(r, c), ok ? g + r * ld + c0 + c : g, ok);
  }
}

__global__ void __launch_bounds__(kThreads, 2) weight_grad_mma_kernel(Args<bf16> a) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int tid = threadIdx.x, warp = tid / 32;
  const int64_t m0 = int64_t(blockIdx.x) * kTileM, n0 = int64_t(blockIdx.y) * kTileN;
  const int wm = (warp / 2) * 64, wn = (warp % 2) * 64;
  auto x_tile = [&](int st) { return XTile{reinterpret_cast<bf16*>(smem + st * kStageBytes)}; };
  auto dy_tile = [&](int st) { return DyTile{reinterpret_cast<bf16*>(smem + st * kStageBytes + XTile::bytes)}; };
  auto load = [&](int64_t s) {
    const Step p = step_at(s, a.batch, a.len);
    const int st = int(s % kStages);
    load_step(x_tile(st), a.ops.x + p.b * a.ops.x_seq_stride + p.t0 * a.ops.ldx, a.ops.ldx, p.n, m0, a.in, tid);
    load_step(dy_tile(st), a.ops.dy + p.b * a.ops.dy_seq_stride + p.t0 * a.ops.ldy, a.ops.ldy, p.n, n0, a.out, tid);
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

// One thread per dW entry (i fastest: coalesced x loads), tokens in the walk's order.
template <class In>
__global__ void weight_grad_plain_kernel(Args<In> a) {
  const int64_t n = a.in * a.out;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e % a.in, j = e / a.in;
    float acc = a.dW[i * a.out + j];
    for (int64_t s = 0; s < a.steps; ++s) {
      const Step p = step_at(s, a.batch, a.len);
      const In* x = a.ops.x + p.b * a.ops.x_seq_stride + p.t0 * a.ops.ldx + i;
      const In* dy = a.ops.dy + p.b * a.ops.dy_seq_stride + p.t0 * a.ops.ldy + j;
      for (int t = 0; t < p.n; ++t) acc += cuda::to_f32(x[t * a.ops.ldx]) * cuda::to_f32(dy[t * a.ops.ldy]);
    }
    a.dW[i * a.out + j] = acc;
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

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
                      int64_t out, cudaStream_t stream) {
  SF_CHECK(batch >= 0 && len >= 0 && in >= 0 && out >= 0, "weight_grad_cuda: negative size (batch ", batch,
           ", len ", len, ", in ", in, ", out ", out, ")");
  if (batch == 0 || len == 0 || in == 0 || out == 0) return;
  const Args<In> a{ops, dW, batch, len, in, out, batch * token_blocks(len)};
  if constexpr (std::is_same_v<In, bf16>) {
    if (mma_loads_ok(ops, in, out) && reinterpret_cast<uintptr_t>(dW) % 8 == 0) {
      SF_CHECK((in + kTileM - 1) / kTileM <= INT32_MAX && (out + kTileN - 1) / kTileN <= 65535,
               "weight_grad_cuda: out = ", out, " is too wide for one launch");
      cuda_check(cudaFuncSetAttribute(weight_grad_mma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes),
                 "cudaFuncSetAttribute (weight_grad_mma_kernel)");
      const dim3 grid(unsigned((in + kTileM - 1) / kTileM), unsigned((out + kTileN - 1) / kTileN));
      weight_grad_mma_kernel<<<grid, kThreads, kSmemBytes, stream>>>(a);
      cuda_check_launch("weight_grad_mma_kernel");
      return;
    }
  }
  const int64_t blocks = std::min<int64_t>((in * out + 255) / 256, 65536);
  weight_grad_plain_kernel<In><<<unsigned(blocks), 256, 0, stream>>>(a);
  cuda_check_launch("weight_grad_plain_kernel");
}

template void weight_grad_cuda<float>(const WeightGradOperands<float>&, float*, int64_t, int64_t, int64_t, int64_t,
                                      cudaStream_t);
template void weight_grad_cuda<bf16>(const WeightGradOperands<bf16>&, float*, int64_t, int64_t, int64_t, int64_t,
                                     cudaStream_t);

}  // namespace stateflow
