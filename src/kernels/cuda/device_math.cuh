// Device helpers shared by the fused CUDA kernels: 8-wide vector loads and stores that widen
// bf16 or fp32 storage to fp32 registers, warp sums and walks in a fixed order, and the activations of
// kernels/cpu/activations.h in fp32.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace stateflow::cuda {

using bf16 = __nv_bfloat16;

// 8 consecutive values as stored (16 bytes of bf16, 32 of fp32; p 16-byte aligned). Loading
// the raw bytes and widening them later lets several loads be in flight before the first use.
template <class A> struct Raw8;
template <> struct Raw8<bf16> { uint4 u; };
template <> struct Raw8<float> { float4 a, b; };

__device__ inline void load_raw(const bf16* p, Raw8<bf16>& r) { r.u = *reinterpret_cast<const uint4*>(p); }
__device__ inline void load_raw(const float* p, Raw8<float>& r) {
  r.a = reinterpret_cast<const float4*>(p)[0], r.b = reinterpret_cast<const float4*>(p)[1];
}
__device__ inline void zero_raw(Raw8<bf16>& r) { r.u = make_uint4(0, 0, 0, 0); }
__device__ inline void zero_raw(Raw8<float>& r) { r.a = r.b = make_float4(0.f, 0.f, 0.f, 0.f); }

// 2 consecutive values as stored (4 bytes of bf16, 8 of fp32; p aligned to that size): the unit
// of kernels that give a thread 2 channels (a warp's 64 bf16 channels are one 128-byte line).
template <class A> struct Raw2;
template <> struct Raw2<bf16> { uint32_t u; };
template <> struct Raw2<float> { float2 a; };

__device__ inline void load_raw(const bf16* p, Raw2<bf16>& r) { r.u = *reinterpret_cast<const uint32_t*>(p); }
__device__ inline void load_raw(const float* p, Raw2<float>& r) { r.a = *reinterpret_cast<const float2*>(p); }
__device__ inline void zero_raw(Raw2<bf16>& r) { r.u = 0; }
__device__ inline void zero_raw(Raw2<float>& r) { r.a = make_float2(0.f, 0.f); }

__device__ inline void widen(const Raw2<bf16>& r, float (&v)[2]) {
  const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&r.u));
  v[0] = f.x, v[1] = f.y;
}
__device__ inline void widen(const Raw2<float>& r, float (&v)[2]) { v[0] = r.a.x, v[1] = r.a.y; }

__device__ inline void widen(const Raw8<bf16>& r, float (&v)[8]) {
  const uint32_t w[4] = {r.u.x, r.u.y, r.u.z, r.u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[i]));
    v[2 * i] = f.x, v[2 * i + 1] = f.y;
  }
}
__device__ inline void widen(const Raw8<float>& r, float (&v)[8]) {
  v[0] = r.a.x, v[1] = r.a.y, v[2] = r.a.z, v[3] = r.a.w, v[4] = r.b.x, v[5] = r.b.y, v[6] = r.b.z, v[7] = r.b.w;
}

template <class A>
__device__ void load8(const A* p, float (&v)[8]) {
  Raw8<A> r;
  load_raw(p, r);
  widen(r, v);
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
__device__ inline void store2(float* p, const float (&v)[2]) { *reinterpret_cast<float2*>(p) = make_float2(v[0], v[1]); }
__device__ inline void store2(bf16* p, const float (&v)[2]) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(v[0], v[1]);  // store8's rounding
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

// acc + at(0) + at(1) + ... + at(n - 1), added left to right (one chain: a fixed order of
// roundings), with the loads of Ahead values issued before they are added, so that a long walk
// costs one memory latency per Ahead values, not per value. Deep walks (Ahead > 8, the
// reduce_deep lever) read at(n - 1) again past n (not added): loads without branches between
// them, which the compiler issues together (SASS of the blocks walk at 32: all 32 loads before
// the first add; with a branch per load they sat between the branches).
template <int Ahead, class At>
__device__ inline float add_in_order(float acc, int64_t n, At at) {
  for (int64_t w0 = 0; w0 < n; w0 += Ahead) {
    float v[Ahead];
#pragma unroll
    for (int u = 0; u < Ahead; ++u) {
      if constexpr (Ahead > 8) v[u] = at(w0 + u < n ? w0 + u : n - 1);
      else v[u] = w0 + u < n ? at(w0 + u) : 0.f;
    }
#pragma unroll
    for (int u = 0; u < Ahead; ++u)
      if (w0 + u < n) acc += v[u];
  }
  return acc;
}

}  // namespace stateflow::cuda
