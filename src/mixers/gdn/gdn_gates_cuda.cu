#include "mixers/gdn/gdn_gates_cuda.h"

#include <algorithm>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/levers.h"
#include "kernels/cuda/reduce_cuda.h"
#include "kernels/cuda/weight_grad_cuda.h"

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
// of dg * g and da in partial[(b * seq_stride + k) * heads] and partial[((batch + b) *
// seq_stride + k) * heads].
template <class A>
__global__ void gdn_gates_backward_kernel(const A* a, const A* b, const float* A_log, const float* dt_bias,
                                          const float* dg, const float* dbeta, A* da, A* db, int64_t len,
                                          int64_t heads, int64_t seq_stride, float* partial) {
  extern __shared__ float sums[];  // [2][blockDim.x]
  const int t = threadIdx.x;
  const int64_t h = t % heads;
  const int64_t seq = blockIdx.y, batch = gridDim.y;
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
    partial[(seq * seq_stride + blockIdx.x) * heads + t] = x;
    partial[((batch + seq) * seq_stride + blockIdx.x) * heads + t] = y;
  }
}

constexpr int kAddThreads = 512;
// Partials one thread loads before adding them: 32 (a 2K-token step's 32 blocks in one memory
// latency), or 8 with STATEFLOW_LEVERS_OFF=reduce_deep. Same sums.
constexpr int kAhead = 32, kOldAhead = 8;

// Block 0 adds the dA_log partials into dA_log, block 1 the ddt_bias ones into ddt_bias. The
// token blocks of sequence b sit at partial[(b * steps + k) * segs + q] (times heads), q < segs
// for step k. First every (sequence, step, head) adds its step's blocks in ascending order, in
// parallel, into the step's first block; then one thread per head walks the steps from the
// last to the first (sequence batch - 1 first in each), one rounding into the gradient per
// step: the order weight_grad_cuda adds its 2048-token steps in. With one block per step
// (segs = 1) the first stage has nothing to add and this is the old one-block-at-a-time walk.
template <int Ahead>
__global__ void gdn_gates_add_steps_kernel(float* partial, int64_t batch, int64_t steps, int64_t segs,
                                           int64_t blocks, int64_t heads, float* dA_log, float* ddt_bias) {
  float* p = partial + blockIdx.x * batch * steps * segs * heads;
  float* out = blockIdx.x == 0 ? dA_log : ddt_bias;
  if (segs > 1) {
    for (int64_t e = threadIdx.x; e < batch * steps * heads; e += blockDim.x) {
      const int64_t j = e % heads, k = (e / heads) % steps, b = e / (heads * steps);
      const int64_t n = min(segs, blocks - k * segs);  // the last step may be short
      float* q = p + (b * steps + k) * segs * heads + j;
      q[0] = cuda::add_in_order<Ahead>(q[0], n - 1, [&](int64_t u) { return q[(u + 1) * heads]; });
    }
    __syncthreads();  // the step sums are global stores of this block: visible to it after the barrier
  }
  const int64_t n = batch * steps;  // walk step w: step steps - 1 - w / batch of sequence batch - 1 - w % batch
  for (int64_t j = threadIdx.x; j < heads; j += blockDim.x) {
    auto at = [&](int64_t w) {
      const int64_t k = steps - 1 - w / batch, b = batch - 1 - w % batch;
      return p[(b * steps + k) * segs * heads + j];
    };
    out[j] = cuda::add_in_order<Ahead>(out[j], n, at);
  }
}

// Token blocks of a sequence of len tokens, rounded up to whole steps of the largest step.
int64_t padded_blocks(int64_t len) {
  constexpr int64_t segs = kWeightGradTokens / kTokenBlock;
  return (token_blocks(len) + segs - 1) / segs * segs;
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
  return batch > 0 ? size_t(2 * batch * padded_blocks(rows / batch) * heads) * sizeof(float) : 0;
}

int64_t gdn_gates_step_tokens() { return lever_off("gate_steps") ? kTokenBlock : kWeightGradTokens; }

template <class A>
void gdn_gates_backward_cuda(const A* a, const A* b, const float* A_log, const float* dt_bias, const float* dg,
                             const float* dbeta, A* da, A* db, float* dA_log, float* ddt_bias, int64_t rows,
                             int64_t heads, int64_t batch, void* workspace, cudaStream_t stream,
                             int64_t step_tokens) {
  const char* name = "gdn_gates_backward_cuda";
  check_shape(name, rows, heads);
  SF_CHECK(batch > 0 && batch <= 65535 && rows % batch == 0, name, ": rows = ", rows, " is not batch = ", batch,
           " sequences of equal length");
  SF_CHECK(step_tokens > 0 && step_tokens <= kWeightGradTokens && step_tokens % kTokenBlock == 0, name,
           ": step_tokens = ", step_tokens, " must be a multiple of ", kTokenBlock, " up to ", kWeightGradTokens,
           " (the steps the parameter gradients are added in)");
  if (rows == 0) return;
  SF_CHECK(workspace != nullptr, name, ": workspace is null; allocate gdn_gates_backward_workspace_bytes()");
  const int64_t len = rows / batch, blocks = token_blocks(len), segs = step_tokens / kTokenBlock;
  const int64_t steps = (blocks + segs - 1) / segs;
  const int threads = block_size(heads);
  auto* partial = static_cast<float*>(workspace);
  gdn_gates_backward_kernel<<<dim3(unsigned(blocks), unsigned(batch)), threads, 2 * threads * sizeof(float), stream>>>(
      a, b, A_log, dt_bias, dg, dbeta, da, db, len, heads, steps * segs, partial);
  cuda_check_launch("gdn_gates_backward_kernel");
  if (lever_off("reduce_deep"))
    gdn_gates_add_steps_kernel<kOldAhead>
        <<<2, kAddThreads, 0, stream>>>(partial, batch, steps, segs, blocks, heads, dA_log, ddt_bias);
  else
    gdn_gates_add_steps_kernel<kAhead>
        <<<2, kAddThreads, 0, stream>>>(partial, batch, steps, segs, blocks, heads, dA_log, ddt_bias);
  cuda_check_launch("gdn_gates_add_steps_kernel");
}

#define SF_INSTANTIATE(A)                                                                                        \
  template void gdn_gates_forward_cuda<A>(const A*, const A*, const float*, const float*, float*, float*,       \
                                          int64_t, int64_t, cudaStream_t);                                      \
  template void gdn_gates_backward_cuda<A>(const A*, const A*, const float*, const float*, const float*,        \
                                           const float*, A*, A*, float*, float*, int64_t, int64_t, int64_t,     \
                                           void*, cudaStream_t, int64_t);
SF_INSTANTIATE(float)
SF_INSTANTIATE(bf16)
#undef SF_INSTANTIATE

}  // namespace stateflow
