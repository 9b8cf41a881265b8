#include "mixers/gdn/gdn_gates_cuda.h"

#include <algorithm>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/reduce_cuda.h"

namespace stateflow {
namespace {

using cuda::bf16;

// A multiple of heads, so that thread t always sees head t % heads as it strides over
// [rows, heads] in steps of the block size.
int block_size(int64_t heads) { return int(heads * (256 / heads)); }

template <class A>
__global__ void gdn_gates_forward_kernel(const A* a, const A* b, const float* A_log, const float* dt_bias, float* g,
                                         float* beta, int64_t n, int64_t heads) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t h = i % heads;
    beta[i] = cuda::sigmoid(cuda::to_f32(b[i]));
    g[i] = -expf(A_log[h]) * cuda::softplus(cuda::to_f32(a[i]) + dt_bias[h]);
  }
}

// Block (k, b) owns token block k of sequence b (of len tokens) and leaves its per-head sums
// of dg * g and da in partial[b * blocks + k] and partial[(batch + b) * blocks + k].
template <class A>
__global__ void gdn_gates_backward_kernel(const A* a, const A* b, const float* A_log, const float* dt_bias,
                                          const float* dg, const float* dbeta, A* da, A* db, int64_t len,
                                          int64_t heads, float* partial) {
  extern __shared__ float sums[];  // [2][blockDim.x]
  const int t = threadIdx.x;
  const int64_t h = t % heads;
  const int64_t blocks = gridDim.x, seq = blockIdx.y, batch = gridDim.y;
  const int64_t t0 = int64_t(blockIdx.x) * kTokenBlock, t1 = min(len, t0 + kTokenBlock);
  const int64_t i0 = (seq * len + t0) * heads, i1 = (seq * len + t1) * heads;
  const float decay_rate = expf(A_log[h]), bias = dt_bias[h];
  float s_alog = 0.f, s_dt = 0.f;
  for (int64_t i = i0 + t; i < i1; i += blockDim.x) {
    const float x = cuda::to_f32(a[i]) + bias;
    const float g = -decay_rate * cuda::softplus(x);
    const float dai = -dg[i] * decay_rate * cuda::sigmoid(x);
    const float beta = cuda::sigmoid(cuda::to_f32(b[i]));
    da[i] = cuda::from_f32<A>(dai);
    db[i] = cuda::from_f32<A>(dbeta[i] * beta * (1.f - beta));
    s_alog += dg[i] * g;
    s_dt += dai;
  }
  sums[t] = s_alog, sums[blockDim.x + t] = s_dt;
  __syncthreads();
  if (t < heads) {  // thread h adds up the threads of head h in ascending order
    float x = 0.f, y = 0.f;
    for (int u = t; u < blockDim.x; u += heads) x += sums[u], y += sums[blockDim.x + u];
    partial[(seq * blocks + blockIdx.x) * heads + t] = x;
    partial[((batch + seq) * blocks + blockIdx.x) * heads + t] = y;
  }
}

void check_shape(const char* name, int64_t rows, int64_t heads) {
  SF_CHECK(heads >= 1 && heads <= 256 && rows >= 0, name, ": heads = ", heads, " must be in [1, 256] on the GPU");
}

}  // namespace

template <class A>
void gdn_gates_forward_cuda(const A* a, const A* b, const float* A_log, const float* dt_bias, float* g, float* beta,
                            int64_t rows, int64_t heads, cudaStream_t stream) {
  check_shape("gdn_gates_forward_cuda", rows, heads);
  const int64_t n = rows * heads;
  if (n == 0) return;
  gdn_gates_forward_kernel<<<unsigned(std::min<int64_t>((n + 255) / 256, 65536)), 256, 0, stream>>>(
      a, b, A_log, dt_bias, g, beta, n, heads);
  cuda_check_launch("gdn_gates_forward_kernel");
}

size_t gdn_gates_backward_workspace_bytes(int64_t rows, int64_t heads, int64_t batch) {
  return batch > 0 ? size_t(2 * batch * token_blocks(rows / batch) * heads) * sizeof(float) : 0;
}

template <class A>
void gdn_gates_backward_cuda(const A* a, const A* b, const float* A_log, const float* dt_bias, const float* dg,
                             const float* dbeta, A* da, A* db, float* dA_log, float* ddt_bias, int64_t rows,
                             int64_t heads, int64_t batch, void* workspace, cudaStream_t stream) {
  const char* name = "gdn_gates_backward_cuda";
  check_shape(name, rows, heads);
  SF_CHECK(batch > 0 && batch <= 65535 && rows % batch == 0, name, ": rows = ", rows, " is not batch = ", batch,
           " sequences of equal length");
  if (rows == 0) return;
  SF_CHECK(workspace != nullptr, name, ": workspace is null; allocate gdn_gates_backward_workspace_bytes()");
  const int64_t len = rows / batch, blocks = token_blocks(len);
  const int threads = block_size(heads);
  auto* partial = static_cast<float*>(workspace);
  gdn_gates_backward_kernel<<<dim3(unsigned(blocks), unsigned(batch)), threads, 2 * threads * sizeof(float), stream>>>(
      a, b, A_log, dt_bias, dg, dbeta, da, db, len, heads, partial);
  cuda_check_launch("gdn_gates_backward_kernel");
  add_token_block_partials_cuda(partial, batch, blocks, blocks, 1, heads, dA_log, stream);
  add_token_block_partials_cuda(partial + batch * blocks * heads, batch, blocks, blocks, 1, heads, ddt_bias, stream);
}

#define SF_INSTANTIATE(A)                                                                                        \
  template void gdn_gates_forward_cuda<A>(const A*, const A*, const float*, const float*, float*, float*,       \
                                          int64_t, int64_t, cudaStream_t);                                      \
  template void gdn_gates_backward_cuda<A>(const A*, const A*, const float*, const float*, const float*,        \
                                           const float*, A*, A*, float*, float*, int64_t, int64_t, int64_t,     \
                                           void*, cudaStream_t);
SF_INSTANTIATE(float)
SF_INSTANTIATE(bf16)
#undef SF_INSTANTIATE

}  // namespace stateflow
