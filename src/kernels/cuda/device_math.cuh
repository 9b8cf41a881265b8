// Device helpers shared by the fused CUDA kernels: 8-wide vector loads and stores that widen
// bf16 or fp32 storage to fp32 registers, warp sums in a fixed order, and the activations of
// kernels/cpu/activations.h in fp32.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace stateflow::cuda {

using bf16 = __nv_bfloat16;

// 8 consecutive values: one 16-byte access for bf16, two for fp32 (p 16-byte aligned).
__device__ inline void load8(const float* p, float (&v)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ inline void load8(const bf16* p, float (&v)[8]) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[i]));
    v[2 * i] = f.x, v[2 * i + 1] = f.y;
  }
}
__device__ inline void store8(float* p, const float (&v)[8]) {
  reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}
__device__ inline void store8(bf16* p, const float (&v)[8]) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
    w[i] = *reinterpret_cast<const uint32_t*>(&h);
  }
  *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
}
__device__ inline void zero8(float (&v)[8]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = 0.f;
}

__device__ inline float to_f32(float x) { return x; }
__device__ inline float to_f32(bf16 x) { return __bfloat162float(x); }
template <class T> __device__ T from_f32(float x);
template <> __device__ inline float from_f32<float>(float x) { return x; }
template <> __device__ inline bf16 from_f32<bf16>(float x) { return __float2bfloat16(x); }

// Butterfly sum: every lane gets the same value, added in the same order on every run.
__device__ inline float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

__device__ inline float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }
__device__ inline float silu(float x) { return x * sigmoid(x); }
__device__ inline float silu_grad(float x) {
  const float s = sigmoid(x);
  return s * (1.f + x * (1.f - s));
}
// silu and its derivative from one sigmoid.
__device__ inline void silu_and_grad(float x, float& silu_x, float& grad) {
  const float s = sigmoid(x);
  silu_x = x * s;
  grad = s * (1.f + x * (1.f - s));
}
__device__ inline float softplus(float x) { return x > 20.f ? x : log1pf(expf(x)); }

}  // namespace stateflow::cuda
