#include "kernels/cuda/cross_entropy_cuda.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/weight_grad_cuda.h"

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

// Statistics of token block (blockIdx.x + first_block) of sequence blockIdx.y: its rows of the
// current block of rows (n_tokens per sequence) summed in ascending order, in double.
__global__ void cross_entropy_stats_kernel(const float* row_loss, const unsigned* row_flags, int64_t n_tokens,
                                           int64_t first_block, int64_t blocks_per_seq, LossStatsCuda* stats) {
  const int64_t b = blockIdx.y, t0 = int64_t(blockIdx.x) * kTokenBlock;
  const int64_t t1 = min(n_tokens, t0 + kTokenBlock);
  LossStatsCuda s{0.0, 0, 0, 0};
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t r = b * n_tokens + t;
    s.loss_sum += double(row_loss[r]);
    s.counted += (row_flags[r] & kCounted) != 0, s.correct += (row_flags[r] & kCorrect) != 0;
    s.bad_targets += (row_flags[r] & kBadTarget) != 0;
  }
  stats[b * blocks_per_seq + first_block + blockIdx.x] = s;
}

struct CeLayout {
  size_t logits, dlogits, row_loss, row_flags, total;
  CeLayout(int64_t block_rows, int64_t vocab, size_t in_bytes) {
    auto up = [](size_t b) { return (b + 255) / 256 * 256; };
    const size_t n = size_t(block_rows) * size_t(vocab);
    logits = 0;
    dlogits = up(n * 4);
    row_loss = dlogits + up(n * in_bytes);
    row_flags = row_loss + up(size_t(block_rows) * 4);
    total = row_flags + up(size_t(block_rows) * 4);
  }
};

}  // namespace

LossStats add_loss_stats_cuda(const LossStatsCuda* stats, int64_t batch, int64_t len, int64_t vocab,
                              cudaStream_t stream, LossStats* running) {
  const int64_t blocks = token_blocks(len);
  std::vector<LossStatsCuda> h(size_t(loss_stats_blocks(batch, len)));
  cuda_check(cudaMemcpyAsync(h.data(), stats, h.size() * sizeof(LossStatsCuda), cudaMemcpyDeviceToHost, stream),
             "cudaMemcpyAsync (loss stats)");
  cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (loss stats)");
  LossStats total;
  unsigned long long bad = 0;
  for (int64_t k = 0; k < blocks; ++k)
    for (int64_t b = 0; b < batch; ++b) {
      const LossStatsCuda& e = h[size_t(b * blocks + k)];
      LossStats s;
      s.loss_sum = e.loss_sum, s.correct = int64_t(e.correct), s.counted = int64_t(e.counted);
      total.add(s);
      if (running) running->add(s);
      bad += e.bad_targets;
    }
  SF_CHECK(bad == 0, "cross_entropy: ", bad, " targets are outside [0, ", vocab,
           ") and are not the ignore value -1; the targets must be token ids of a vocabulary of at most ", vocab,
           " (check the tokenizer against the model's vocab_size)");
  return total;
}

namespace {
// Token order, as add_loss_stats_cuda: block k of sequences 0 .. batch - 1, then block k + 1.
__global__ void accumulate_loss_stats_kernel(const LossStatsCuda* stats, int64_t batch, int64_t blocks,
                                             LossStatsCuda* running) {
  LossStatsCuda r = *running;
  for (int64_t k = 0; k < blocks; ++k)
    for (int64_t b = 0; b < batch; ++b) {
      const LossStatsCuda& e = stats[b * blocks + k];
      r.loss_sum += e.loss_sum, r.correct += e.correct, r.counted += e.counted, r.bad_targets += e.bad_targets;
    }
  *running = r;
}
}  // namespace

void accumulate_loss_stats_cuda(const LossStatsCuda* stats, int64_t batch, int64_t len, LossStatsCuda* running,
                                cudaStream_t stream) {
  accumulate_loss_stats_kernel<<<1, 1, 0, stream>>>(stats, batch, token_blocks(len), running);
  cuda_check(cudaGetLastError(), "accumulate_loss_stats_kernel launch");
}

template <class In>
size_t lm_head_cross_entropy_workspace_bytes(int64_t batch, int64_t block_tokens, int64_t vocab) {
  return CeLayout(batch * block_tokens, vocab, sizeof(In)).total;
}

template <class In>
void lm_head_cross_entropy_cuda(const CublasGemm& g, const In* x, const In* W, const int32_t* targets, int64_t batch,
                                int64_t len, int64_t dim, int64_t vocab, float scale, int64_t block_tokens, In* dx,
                                float* dW, LossStatsCuda* stats, void* workspace) {
  const char* name = "lm_head_cross_entropy_cuda";
  SF_CHECK(vocab > 0 && vocab % 8 == 0 && vocab <= INT32_MAX, name, ": vocab = ", vocab,
           " must be a multiple of 8 on the GPU (pad the vocabulary)");
  SF_CHECK(batch >= 0 && batch <= 65535 && len >= 0 && dim > 0, name, ": bad shape (batch ", batch, ", len ", len,
           ", dim ", dim, ")");
  SF_CHECK(block_tokens > 0 && block_tokens % kTokenBlock == 0 &&
               (block_tokens % kWeightGradTokens == 0 || kWeightGradTokens % block_tokens == 0),
           name, ": block_tokens = ", block_tokens, " must be a positive multiple of ", kTokenBlock,
           " that divides ", kWeightGradTokens, " or is a multiple of it");
  SF_CHECK((dx == nullptr) == (dW == nullptr), name, ": give both dx and dW (training) or neither (evaluation)");
  SF_CHECK(workspace != nullptr && stats != nullptr, name,
           ": workspace and stats must be device buffers (lm_head_cross_entropy_workspace_bytes)");
  if (batch == 0 || len == 0) return;
  const CeLayout L(batch * block_tokens, vocab, sizeof(In));
  char* ws = static_cast<char*>(workspace);
  auto* logits = reinterpret_cast<float*>(ws + L.logits);
  auto* dlogits = dx ? reinterpret_cast<In*>(ws + L.dlogits) : nullptr;
  auto* row_loss = reinterpret_cast<float*>(ws + L.row_loss);
  auto* row_flags = reinterpret_cast<unsigned*>(ws + L.row_flags);
  const cudaStream_t stream = g.stream();
  const int64_t blocks_per_seq = token_blocks(len);
  // Last block first: the order weight_grad_cuda's walk continues across the calls.
  for (int64_t t0 = (len - 1) / block_tokens * block_tokens; t0 >= 0; t0 -= block_tokens) {
    const int64_t n = std::min(block_tokens, len - t0);  // tokens of each sequence in this block
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t r0 = b * len + t0;  // the sequence's first row of the block; its logits at row b * n
      linear_forward_cuda<In, float>(g, x + r0 * dim, W, logits + b * n * vocab, n, dim, vocab, 1);
      cross_entropy_row_kernel<In><<<unsigned(n), kRowThreads, 0, stream>>>(
          logits + b * n * vocab, targets + r0, vocab, scale, dlogits ? dlogits + b * n * vocab : nullptr,
          row_loss + b * n, row_flags + b * n);
      cuda_check_launch("cross_entropy_row_kernel");
    }
    cross_entropy_stats_kernel<<<dim3(unsigned(token_blocks(n)), unsigned(batch)), 1, 0, stream>>>(
        row_loss, row_flags, n, t0 / kTokenBlock, blocks_per_seq, stats);
    cuda_check_launch("cross_entropy_stats_kernel");
    if (!dx) continue;
    const WeightGradOperands<In> ops{x + t0 * dim, dim, len * dim, dlogits, vocab, n * vocab};
    weight_grad_cuda<In>(g, ops, dW, batch, n, dim, vocab);
    for (int64_t b = 0; b < batch; ++b)
      gemm_cuda<In, In>(g, false, true, n, dim, vocab, 1.f, dlogits + b * n * vocab, vocab, W, vocab, 0.f,
                        dx + (b * len + t0) * dim, dim);
  }
}

template size_t lm_head_cross_entropy_workspace_bytes<float>(int64_t, int64_t, int64_t);
template size_t lm_head_cross_entropy_workspace_bytes<bf16>(int64_t, int64_t, int64_t);
template void lm_head_cross_entropy_cuda<float>(const CublasGemm&, const float*, const float*, const int32_t*,
                                                int64_t, int64_t, int64_t, int64_t, float, int64_t, float*, float*,
                                                LossStatsCuda*, void*);
template void lm_head_cross_entropy_cuda<bf16>(const CublasGemm&, const bf16*, const bf16*, const int32_t*, int64_t,
                                               int64_t, int64_t, int64_t, float, int64_t, bf16*, float*,
                                               LossStatsCuda*, void*);

}  // namespace stateflow
