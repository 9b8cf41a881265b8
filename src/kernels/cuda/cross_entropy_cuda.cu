#include "kernels/cuda/cross_entropy_cuda.h"

#include <algorithm>
#include <cmath>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"

namespace stateflow {
namespace {

using cuda::bf16;

constexpr int kRowThreads = 256;
constexpr int kWarps = kRowThreads / 32;
constexpr unsigned kCounted = 1, kCorrect = 2, kBadTarget = 4;

// Softmax summary of part of a row: max, sum of exp(l - max), first index of the max.
struct Partial {
  float max, sum;
  int arg;
};

__device__ Partial merge(const Partial& a, const Partial& b) {
  if (b.arg < 0) return a;
  if (a.arg < 0) return b;
  const float m = fmaxf(a.max, b.max);
  const int arg = a.max > b.max ? a.arg : b.max > a.max ? b.arg : min(a.arg, b.arg);
  return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m), arg};
}

__device__ void add_value(Partial& p, float x, int v) {
  if (p.arg < 0) {
    p = {x, 1.f, v};
  } else if (x > p.max) {  // strict: equal values keep the earlier index (visited in ascending v)
    p.sum = p.sum * expf(p.max - x) + 1.f;
    p.max = x, p.arg = v;
  } else {
    p.sum += expf(x - p.max);
  }
}

// Every thread of the block gets the whole row's summary; the merge tree is fixed.
__device__ Partial block_merge(Partial p) {
  __shared__ Partial warp_part[kWarps];
  for (int o = 16; o > 0; o >>= 1) {
    Partial q{__shfl_xor_sync(0xffffffffu, p.max, o), __shfl_xor_sync(0xffffffffu, p.sum, o),
              __shfl_xor_sync(0xffffffffu, p.arg, o)};
    p = (threadIdx.x & o) ? merge(q, p) : merge(p, q);  // lower lanes' values first: same tree everywhere
  }
  if (threadIdx.x % 32 == 0) warp_part[threadIdx.x / 32] = p;
  __syncthreads();
  Partial all = warp_part[0];
  for (int w = 1; w < kWarps; ++w) all = merge(all, warp_part[w]);
  return all;
}

__device__ void store4(float* p, const float (&v)[4]) {
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ void store4(bf16* p, const float (&v)[4]) {
  __nv_bfloat162 h[2] = {__floats2bfloat162_rn(v[0], v[1]), __floats2bfloat162_rn(v[2], v[3])};
  *reinterpret_cast<uint2*>(p) = *reinterpret_cast<const uint2*>(h);
}

// One block per row of the current block of rows.
template <class In>
__global__ void cross_entropy_row_kernel(const float* logits, const int32_t* targets, int64_t vocab, float scale,
                                         In* dlogits, float* row_loss, unsigned* row_flags) {
  const int64_t row = blockIdx.x;
  const float* l = logits + row * vocab;
  Partial p{0.f, 0.f, -1};
  for (int64_t v = int64_t(threadIdx.x) * 4; v < vocab; v += kRowThreads * 4) {
    const float4 x = *reinterpret_cast<const float4*>(l + v);
    add_value(p, x.x, int(v)), add_value(p, x.y, int(v + 1)), add_value(p, x.z, int(v + 2)), add_value(p, x.w, int(v + 3));
  }
  const Partial all = block_merge(p);
  const int32_t target = targets[row];
  const bool counted = target >= 0 && target < vocab;
  if (threadIdx.x == 0) {
    row_loss[row] = counted ? logf(all.sum) - (l[target] - all.max) : 0.f;
    row_flags[row] = (counted ? kCounted : 0u) | (counted && all.arg == target ? kCorrect : 0u) |
                     (target < -1 || target >= vocab ? kBadTarget : 0u);
  }
  if (!dlogits) return;
  In* d = dlogits + row * vocab;
  const float inv_sum = 1.f / all.sum;
  for (int64_t v = int64_t(threadIdx.x) * 4; v < vocab; v += kRowThreads * 4) {
    const float4 x = *reinterpret_cast<const float4*>(l + v);
    const float xs[4] = {x.x, x.y, x.z, x.w};
    float out[4];
#pragma unroll
    for (int e = 0; e < 4; ++e)
      out[e] = counted ? scale * (expf(xs[e] - all.max) * inv_sum - (v + e == target ? 1.f : 0.f)) : 0.f;
    store4(d + v, out);
  }
}

// Adds one block of rows' losses and counts to the totals: each thread sums rows
// t, t + 256, ... in double, then a fixed tree over the threads.
__global__ void cross_entropy_stats_kernel(const float* row_loss, const unsigned* row_flags, int64_t n,
                                           LossStatsCuda* stats) {
  __shared__ double loss[kRowThreads];
  __shared__ unsigned long long counts[3][kRowThreads];
  const int t = threadIdx.x;
  double s = 0;
  unsigned long long c[3] = {0, 0, 0};
  for (int64_t r = t; r < n; r += kRowThreads) {
    s += double(row_loss[r]);
    c[0] += (row_flags[r] & kCounted) != 0, c[1] += (row_flags[r] & kCorrect) != 0;
    c[2] += (row_flags[r] & kBadTarget) != 0;
  }
  loss[t] = s, counts[0][t] = c[0], counts[1][t] = c[1], counts[2][t] = c[2];
  __syncthreads();
  for (int half = kRowThreads / 2; half > 0; half /= 2) {
    if (t < half) {
      loss[t] += loss[t + half];
      for (int k = 0; k < 3; ++k) counts[k][t] += counts[k][t + half];
    }
    __syncthreads();
  }
  if (t == 0) {
    stats->loss_sum += loss[0];
    stats->counted += counts[0][0], stats->correct += counts[1][0], stats->bad_targets += counts[2][0];
  }
}

struct CeLayout {
  size_t logits, dlogits, row_loss, row_flags, total;
  CeLayout(int64_t row_block, int64_t vocab, size_t in_bytes) {
    auto up = [](size_t b) { return (b + 255) / 256 * 256; };
    const size_t n = size_t(row_block) * size_t(vocab);
    logits = 0;
    dlogits = up(n * 4);
    row_loss = dlogits + up(n * in_bytes);
    row_flags = row_loss + up(size_t(row_block) * 4);
    total = row_flags + up(size_t(row_block) * 4);
  }
};

}  // namespace

void reset_loss_stats_cuda(LossStatsCuda* stats, cudaStream_t stream) {
  cuda_check(cudaMemsetAsync(stats, 0, sizeof(LossStatsCuda), stream), "cudaMemsetAsync (loss stats)");
}

LossStats fetch_loss_stats_cuda(const LossStatsCuda* stats, int64_t vocab, cudaStream_t stream) {
  LossStatsCuda h{};
  cuda_check(cudaMemcpyAsync(&h, stats, sizeof h, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync (loss stats)");
  cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (loss stats)");
  SF_CHECK(h.bad_targets == 0, "cross_entropy: ", h.bad_targets, " targets are outside [0, ", vocab,
           ") and are not the ignore value -1; the targets must be token ids of a vocabulary of at most ", vocab,
           " (check the tokenizer against the model's vocab_size)");
  LossStats s;
  s.loss_sum = h.loss_sum, s.correct = int64_t(h.correct), s.counted = int64_t(h.counted);
  return s;
}

template <class In>
size_t lm_head_cross_entropy_workspace_bytes(int64_t row_block, int64_t vocab) {
  return CeLayout(row_block, vocab, sizeof(In)).total;
}

template <class In>
void lm_head_cross_entropy_cuda(const CublasGemm& g, const In* x, const In* W, const int32_t* targets, int64_t rows,
                                int64_t dim, int64_t vocab, float scale, int64_t row_block, In* dx, float* dW,
                                LossStatsCuda* stats, void* workspace) {
  const char* name = "lm_head_cross_entropy_cuda";
  SF_CHECK(vocab > 0 && vocab % 8 == 0 && vocab <= INT32_MAX, name, ": vocab = ", vocab,
           " must be a multiple of 8 on the GPU (pad the vocabulary)");
  SF_CHECK(row_block > 0 && rows >= 0 && dim > 0, name, ": row_block = ", row_block, " must be positive");
  SF_CHECK((dx == nullptr) == (dW == nullptr), name, ": give both dx and dW (training) or neither (evaluation)");
  SF_CHECK(workspace != nullptr && stats != nullptr, name,
           ": workspace and stats must be device buffers (lm_head_cross_entropy_workspace_bytes)");
  const CeLayout L(row_block, vocab, sizeof(In));
  char* ws = static_cast<char*>(workspace);
  auto* logits = reinterpret_cast<float*>(ws + L.logits);
  auto* dlogits = dx ? reinterpret_cast<In*>(ws + L.dlogits) : nullptr;
  auto* row_loss = reinterpret_cast<float*>(ws + L.row_loss);
  auto* row_flags = reinterpret_cast<unsigned*>(ws + L.row_flags);
  const cudaStream_t stream = g.stream();
  for (int64_t r0 = 0; r0 < rows; r0 += row_block) {
    const int64_t n = std::min(row_block, rows - r0);
    const In* xb = x + r0 * dim;
    linear_forward_cuda<In, float>(g, xb, W, logits, n, dim, vocab);
    cross_entropy_row_kernel<In><<<unsigned(n), kRowThreads, 0, stream>>>(logits, targets + r0, vocab, scale,
                                                                            dlogits, row_loss, row_flags);
    cuda_check_launch("cross_entropy_row_kernel");
    cross_entropy_stats_kernel<<<1, kRowThreads, 0, stream>>>(row_loss, row_flags, n, stats);
    cuda_check_launch("cross_entropy_stats_kernel");
    if (!dx) continue;
    linear_backward_weight_cuda<In>(g, xb, dlogits, dW, n, dim, vocab);
    gemm_cuda<In, In>(g, false, true, n, dim, vocab, 1.f, dlogits, vocab, W, vocab, 0.f, dx + r0 * dim, dim);
  }
}

template size_t lm_head_cross_entropy_workspace_bytes<float>(int64_t, int64_t);
template size_t lm_head_cross_entropy_workspace_bytes<bf16>(int64_t, int64_t);
template void lm_head_cross_entropy_cuda<float>(const CublasGemm&, const float*, const float*, const int32_t*,
                                                int64_t, int64_t, int64_t, float, int64_t, float*, float*,
                                                LossStatsCuda*, void*);
template void lm_head_cross_entropy_cuda<bf16>(const CublasGemm&, const bf16*, const bf16*, const int32_t*, int64_t,
                                               int64_t, int64_t, float, int64_t, bf16*, float*, LossStatsCuda*,
                                               void*);

}  // namespace stateflow
