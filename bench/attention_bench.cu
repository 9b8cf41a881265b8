// Benchmark of the GPU prefix attention kernels (mixers/attention/prefix_attention_cuda.h):
// causal attention over a whole sequence, then (with --chunk-len) the chunked case, one
// chunk of queries against the K/V prefix of every chunk before it, per chunk position.
// CUDA events, median of --reps after warm-ups (bench/bench_util.cuh); random normal inputs.
//
//   attention_bench [--len 32768] [--heads 16] [--kv-heads 16] [--head-dim 128] [--batch 1]
//                   [--reps 10] [--chunk-len 0]
//
// FLOPs are counted as FlashAttention's papers do: forward 4 x head_dim per (query, key)
// pair the causal mask lets through, backward 2.5 times that (it recomputes the scores).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "bench_util.cuh"
#include "mixers/attention/prefix_attention_cuda.h"

namespace {

using bf16 = __nv_bfloat16;
using namespace stateflow;

template <class T>
__global__ void fill_normal(T* x, int64_t n, uint64_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = T(bench::hash_normal(uint64_t(i), seed));
}

template <class T>
T* random_device_array(int64_t n, uint64_t seed) {
  T* d = nullptr;
  CK(cudaMalloc(&d, size_t(n) * sizeof(T)));
  fill_normal<T><<<std::min(bench::blocks(n, 256), 4096u), 256>>>(d, n, seed);
  CK(cudaGetLastError());
  return d;
}

// Forward FLOPs of d: 4 x head_dim per visible (query, key) pair, all heads and sequences.
double forward_flops(const AttentionDims& d) {
  const double pairs = double(d.len) * double(d.offset) + double(d.len) * double(d.len + 1) / 2;
  return 4.0 * double(d.head_dim) * pairs * double(d.q_heads) * double(d.batch);
}

struct Buffers {
  bf16 *q, *k, *v, *o, *dout, *dq;
  float *lse, *dk, *dv;
  void* ws;
};

struct Times {
  float fwd, bwd;
};

Times time_one(const AttentionDims& d, const Buffers& b, int reps) {
  auto fwd = [&] { prefix_attention_forward_cuda(d, b.q, b.k, b.v, b.o, b.lse, nullptr); };
  auto bwd = [&] {
    prefix_attention_backward_cuda(d, b.q, b.k, b.v, b.o, b.lse, b.dout, b.dq, b.dk, b.dv, b.ws, nullptr);
  };
  fwd();
  return {bench::median_ms(fwd, reps), bench::median_ms(bwd, reps)};
}

}  // namespace

int main(int argc, char** argv) {
  int64_t len = 32768, heads = 16, kv_heads = 16, head_dim = 128, batch = 1, chunk_len = 0;
  int reps = 10;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> int64_t {
      if (i + 1 >= argc) std::fprintf(stderr, "attention_bench: %s needs a value\n", a.c_str()), std::exit(2);
      return std::atoll(argv[++i]);
    };
    if (a == "--len") len = next();
    else if (a == "--heads") heads = next();
    else if (a == "--kv-heads") kv_heads = next();
    else if (a == "--head-dim") head_dim = next();
    else if (a == "--batch") batch = next();
    else if (a == "--reps") reps = int(next());
    else if (a == "--chunk-len") chunk_len = next();
    else {
      std::fprintf(stderr,
                   "usage: attention_bench [--len 32768] [--heads 16] [--kv-heads 16] [--head-dim 128] [--batch 1] "
                   "[--reps 10] [--chunk-len 0]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  if (reps < 1 || chunk_len < 0 || chunk_len > len) {
    std::fprintf(stderr, "attention_bench: --reps must be >= 1 and --chunk-len in [0, --len]\n");
    return 2;
  }
  const AttentionDims whole{batch, len, 0, len, heads, kv_heads, head_dim, 1.0 / std::sqrt(double(head_dim))};
  try {
    check_attention_dims_cuda(whole);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attention_bench: %s\n", e.what());
    return 2;
  }
  const int64_t nq = batch * len * heads * head_dim, nkv = batch * len * kv_heads * head_dim;
  Buffers b{random_device_array<bf16>(nq, 1), random_device_array<bf16>(nkv, 2), random_device_array<bf16>(nkv, 3),
            random_device_array<bf16>(nq, 4), random_device_array<bf16>(nq, 5), random_device_array<bf16>(nq, 6),
            random_device_array<float>(batch * len * heads, 7), random_device_array<float>(nkv, 8),
            random_device_array<float>(nkv, 9), nullptr};
  CK(cudaMalloc(&b.ws, prefix_attention_workspace_bytes(whole)));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("attention_bench on %s: batch %lld, %lld query heads, %lld K/V heads of %lld, causal, bf16, median of %d\n",
              prop.name, (long long)batch, (long long)heads, (long long)kv_heads, (long long)head_dim, reps);

  std::printf("\n| tokens | forward ms | backward ms | fwd+bwd ms | fwd TFLOP/s | fwd+bwd TFLOP/s |\n");
  std::printf("| ---: | ---: | ---: | ---: | ---: | ---: |\n");
  const Times t = time_one(whole, b, reps);
  const double f = forward_flops(whole);
  std::printf("| %lld | %.3f | %.3f | %.3f | %.1f | %.1f |\n", (long long)len, t.fwd, t.bwd, t.fwd + t.bwd,
              f / t.fwd * 1e-9, 3.5 * f / (t.fwd + t.bwd) * 1e-9);

  if (chunk_len > 0 && batch == 1) {  // chunk rows are contiguous only for one sequence
    std::printf("\nOne chunk of %lld queries against the prefix (K/V rows 0 .. offset + chunk):\n", (long long)chunk_len);
    std::printf("| chunk | offset | forward ms | backward ms | fwd TFLOP/s | bwd TFLOP/s |\n");
    std::printf("| ---: | ---: | ---: | ---: | ---: | ---: |\n");
    double sum = 0;
    for (int64_t c = 0; c * chunk_len < len; ++c) {
      AttentionDims d = whole;
      d.offset = c * chunk_len, d.len = std::min(chunk_len, len - d.offset);
      const int64_t row = heads * head_dim;
      Buffers bc = b;
      bc.q += d.offset * row, bc.o += d.offset * row, bc.dout += d.offset * row, bc.dq += d.offset * row;
      bc.lse += d.offset * heads;
      const Times tc = time_one(d, bc, reps);
      const double fc = forward_flops(d);
      sum += tc.fwd + tc.bwd;
      std::printf("| %lld | %lld | %.3f | %.3f | %.1f | %.1f |\n", (long long)c, (long long)d.offset, tc.fwd, tc.bwd,
                  fc / tc.fwd * 1e-9, 2.5 * fc / tc.bwd * 1e-9);
    }
    std::printf("sum over chunks, fwd+bwd: %.3f ms (whole sequence %.3f ms)\n", sum, t.fwd + t.bwd);
  }
  return 0;
}
