#include "mixers/attention/attention_elementwise_cuda.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_graph_cuda.h"

namespace stateflow {
namespace {

using bf16 = __nv_bfloat16;

unsigned grid_for(int64_t n, int threads) { return unsigned(std::min<int64_t>((n + threads - 1) / threads, 65535)); }

// One thread per (token, head, rotated pair), grid-strided.
__global__ void rope_kernel(RopeDims d, bf16* x, double sign) {
  const int64_t half = d.rotary_dim / 2, n = d.batch * d.len * d.heads * half;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < n; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t e = t % half, row = t / half;  // row = (b * len + i) * heads + h
    const int64_t i = (row / d.heads) % d.len;
    const double angle = double(d.offset + i) * pow(d.theta, -2.0 * double(e) / double(d.rotary_dim));
    const float c = float(cos(angle)), s = float(sign * sin(angle));
    bf16* xh = x + row * d.head_dim;
    const float x1 = __bfloat162float(xh[e]), x2 = __bfloat162float(xh[e + half]);
    xh[e] = __float2bfloat16(x1 * c - x2 * s);
    xh[e + half] = __float2bfloat16(x2 * c + x1 * s);
  }
}

void rope_cuda(const RopeDims& d, bf16* x, double sign, cudaStream_t st) {
  SF_CHECK(d.rotary_dim >= 2 && d.rotary_dim % 2 == 0 && d.rotary_dim <= d.head_dim, "rope: rotary_dim ",
           d.rotary_dim, " must be even, >= 2 and <= head_dim ", d.head_dim);
  const int64_t n = d.batch * d.len * d.heads * (d.rotary_dim / 2);
  if (n == 0) return;
  rope_kernel<<<grid_for(n, 256), 256, 0, st>>>(d, x, sign);
  cuda_check_launch("rope kernel");
}

__device__ float sigmoidf(float x) { return 1.f / (1.f + __expf(-x)); }

__global__ void gate_forward_kernel(const bf16* o, const bf16* g, bf16* y, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = __float2bfloat16(__bfloat162float(o[i]) * sigmoidf(__bfloat162float(g[i])));
}

__global__ void gate_backward_kernel(const bf16* o, const bf16* g, const bf16* dy, bf16* d_o, bf16* dg, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float s = sigmoidf(__bfloat162float(g[i])), d = __bfloat162float(dy[i]);
    d_o[i] = __float2bfloat16(d * s);
    dg[i] = __float2bfloat16(d * __bfloat162float(o[i]) * s * (1.f - s));
  }
}

// One thread per element of the chunk's rows: t[b, i, c] <- buf[b, offset + i, c]; buf's copy zeroed.
__global__ void take_rows_kernel(PrefixRows r, float* buf, bf16* t) {
  const int64_t n = r.batch * r.len * r.width;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = k % r.width, i = (k / r.width) % r.len, b = k / (r.width * r.len);
    float& x = buf[(b * r.seq_len + r.offset + i) * r.width + c];
    t[k] = __float2bfloat16(x);
    x = 0.f;
  }
}

}  // namespace

void rope_forward_cuda(const RopeDims& d, bf16* x, cudaStream_t st) { rope_cuda(d, x, 1.0, st); }
void rope_backward_cuda(const RopeDims& d, bf16* dx, cudaStream_t st) { rope_cuda(d, dx, -1.0, st); }

void sigmoid_gate_forward_cuda(const bf16* o, const bf16* g, bf16* y, int64_t n, cudaStream_t st) {
  if (n == 0) return;
  gate_forward_kernel<<<grid_for(n, 256), 256, 0, st>>>(o, g, y, n);
  cuda_check_launch("sigmoid gate forward kernel");
}

void sigmoid_gate_backward_cuda(const bf16* o, const bf16* g, const bf16* dy, bf16* d_o, bf16* dg, int64_t n,
                                cudaStream_t st) {
  if (n == 0) return;
  gate_backward_kernel<<<grid_for(n, 256), 256, 0, st>>>(o, g, dy, d_o, dg, n);
  cuda_check_launch("sigmoid gate backward kernel");
}

// While a CUDA graph records (kernels/cuda/device_graph_cuda.h, lever graphs), one plain copy per
// sequence instead of one strided copy: a graph of plain copies can be updated to the next
// chunk's addresses, one with a strided copy is instantiated anew for every chunk.
void write_prefix_rows_cuda(const PrefixRows& r, const bf16* t, bf16* buf, cudaStream_t st) {
  const size_t row_bytes = size_t(r.width) * sizeof(bf16);
  if (recording_gemm_for_thread()) {
    for (int64_t b = 0; b < r.batch; ++b)
      cuda_check(cudaMemcpyAsync(buf + (b * r.seq_len + r.offset) * r.width, t + b * r.len * r.width,
                                 size_t(r.len) * row_bytes, cudaMemcpyDeviceToDevice, st),
                 "copying a chunk's K/V rows into the prefix");
    return;
  }
  cuda_check(cudaMemcpy2DAsync(buf + r.offset * r.width, size_t(r.seq_len) * row_bytes, t, size_t(r.len) * row_bytes,
                               size_t(r.len) * row_bytes, size_t(r.batch), cudaMemcpyDeviceToDevice, st),
             "copying a chunk's K/V rows into the prefix");
}

void take_prefix_rows_cuda(const PrefixRows& r, float* buf, bf16* t, cudaStream_t st) {
  const int64_t n = r.batch * r.len * r.width;
  if (n == 0) return;
  take_rows_kernel<<<grid_for(n, 256), 256, 0, st>>>(r, buf, t);
  cuda_check_launch("taking a chunk's rows out of the K/V prefix gradient");
}

}  // namespace stateflow
