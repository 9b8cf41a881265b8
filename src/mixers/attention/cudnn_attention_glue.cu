// Layout glue for cuDNN's fused attention (cudnn_attention_glue.h).
#include "kernels/cuda/cuda_check.h"
#include "mixers/attention/cudnn_attention_glue.h"

namespace stateflow {
namespace {

using bf16 = __nv_bfloat16;

// One thread per element; `to_tokens` picks the direction.
// One thread per element i of the head-major array [b, h, t]; j is its place in the token-major
// one. `to_tokens` picks the direction.
__global__ void lse_transpose_kernel(const float* src, float* dst, int64_t heads, int64_t len, int64_t rows,
                                     int64_t n, bool to_tokens) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const int64_t per = heads * len, b = i / per, h = (i % per) / len, t = i % len;
  const int64_t j = (b * rows + t) * heads + h;
  if (to_tokens) dst[j] = src[i];
  else dst[i] = src[j];
}

// Eight elements per thread (16-byte bf16 loads, two float4 read-modify-writes): the adds move
// (2 + 8) bytes per element over every row a piece read, so they run at memory speed.
__global__ void add_rows_kernel(const bf16* src, float* dst, int64_t rows, int64_t dst_rows, int64_t width,
                                int64_t n8) {
  const int64_t i8 = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i8 >= n8) return;
  const int64_t i = i8 * 8, per = rows * width, b = i / per;
  const uint4 raw = *reinterpret_cast<const uint4*>(src + i);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
  float4* d = reinterpret_cast<float4*>(dst + b * dst_rows * width + i % per);
  float4 lo = d[0], hi = d[1];
  const float2 a = __bfloat1622float2(h[0]), c = __bfloat1622float2(h[1]), e = __bfloat1622float2(h[2]),
               g = __bfloat1622float2(h[3]);
  lo.x += a.x, lo.y += a.y, lo.z += c.x, lo.w += c.y;
  hi.x += e.x, hi.y += e.y, hi.z += g.x, hi.w += g.y;
  d[0] = lo, d[1] = hi;
}

unsigned blocks(int64_t n) { return unsigned((n + 255) / 256); }

}  // namespace

void transpose_lse_cuda(const float* src, float* dst, int64_t batch, int64_t heads, int64_t len, int64_t rows,
                        bool to_tokens, cudaStream_t st) {
  const int64_t n = batch * heads * len;
  if (n == 0) return;
  lse_transpose_kernel<<<blocks(n), 256, 0, st>>>(src, dst, heads, len, rows, n, to_tokens);
  cuda_check_launch("attention statistics transpose kernel");
}

void add_prefix_rows_cuda(const bf16* src, float* dst, int64_t batch, int64_t rows, int64_t dst_rows, int64_t width,
                          cudaStream_t st) {
  SF_CHECK(width % 8 == 0, "attention dK/dV add: width ", width, " is not a multiple of 8");
  const int64_t n8 = batch * rows * width / 8;
  if (n8 == 0) return;
  add_rows_kernel<<<blocks(n8), 256, 0, st>>>(src, dst, rows, dst_rows, width, n8);
  cuda_check_launch("attention dK/dV add kernel");
}

}  // namespace stateflow
