// Benchmark of GPU prefix attention (mixers/attention/prefix_attention_cuda.h), each
// implementation in turn: cuDNN's fused attention with its deterministic backward (the
// default), cuDNN with its atomic-dQ backward (nondeterministic; measurement only), and our
// kernels. Causal attention over a whole sequence, then (with --chunk-len) the chunked case,
// one chunk of queries against the K/V prefix of every chunk before it, per chunk position.
// CUDA events, median of --reps after warm-ups (bench/bench_util.cuh). Shapes, inputs (drawn
// on the device) and FLOPs are the prefix_attention op's (mixers/attention/prefix_attention_op.cpp).
// The anchor, PyTorch's SDPA on the same shapes, is bench/sdpa_anchor.py.
//
//   attention_bench [--len 32768] [--heads 16] [--kv-heads 16] [--head-dim 128] [--batch 1]
//                   [--reps 10] [--chunk-len 0]
//
// FLOPs are counted as FlashAttention's papers do (the op's count): forward 4 x head_dim per
// (query, key) pair the causal mask lets through, backward 2.5 times that (it recomputes the scores).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "bench_util.cuh"
#include "kernels/cuda/op_buffers.h"
#include "kernels/op_def.h"
#include "mixers/attention/cudnn_attention.h"
#include "mixers/attention/prefix_attention_cuda.h"

namespace {

using bf16 = __nv_bfloat16;
using namespace stateflow;

struct Buffers {
  bf16 *q, *k, *v, *o, *dout, *dq;
  float *lse, *dk, *dv;
};

struct Times {
  float fwd, bwd;
};

// The forward once (the backward reads its o and lse), then each timed.
template <class Fwd, class Bwd>
Times time_fwd_bwd(Fwd&& fwd, Bwd&& bwd, int reps) {
  fwd();
  return {bench::median_ms(fwd, reps), bench::median_ms(bwd, reps)};
}

enum class Impl { Cudnn, CudnnAtomic, Kernels };
const char* impl_name(Impl i) {
  return i == Impl::Cudnn ? "cuDNN" : i == Impl::CudnnAtomic ? "cuDNN, atomic dQ (nondeterministic)" : "our kernels";
}

// A device workspace that grows to the largest size asked for.
struct Workspace {
  void* p = nullptr;
  size_t bytes = 0;
  void* at_least(size_t n) {
    if (n > bytes) {
      if (p) CK(cudaFree(p));
      CK(cudaMalloc(&p, n));
      bytes = n;
    }
    return p;
  }
};

// One call's queries at d.offset against the K/V prefix in b, by `impl`.
Times time_chunk(Impl impl, const AttentionDims& d, const Buffers& b, Workspace& w, int reps) {
  const CudnnBackward mode = impl == Impl::CudnnAtomic ? CudnnBackward::AtomicDq : CudnnBackward::Deterministic;
  void* ws = w.at_least(impl == Impl::Kernels ? prefix_attention_kernels_workspace_bytes(d)
                                              : cudnn_attention_workspace_bytes(d, mode));
  if (impl == Impl::Kernels)
    return time_fwd_bwd([&] { prefix_attention_forward_kernels(d, b.q, b.k, b.v, b.o, b.lse, nullptr); },
                        [&] {
                          prefix_attention_backward_kernels(d, b.q, b.k, b.v, b.o, b.lse, b.dout, b.dq, b.dk, b.dv, ws,
                                                            nullptr);
                        },
                        reps);
  return time_fwd_bwd([&] { cudnn_attention_forward(d, mode, b.q, b.k, b.v, b.o, b.lse, ws, nullptr); },
                      [&] {
                        cudnn_attention_backward(d, mode, b.q, b.k, b.v, b.o, b.lse, b.dout, b.dq, b.dk, b.dv, ws,
                                                 nullptr);
                      },
                      reps);
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
  // Shape, inputs and FLOPs are the prefix_attention op's (mixers/attention/prefix_attention_op.cpp),
  // the definition the kernels' CUDA test checks against float64.
  const OpDef& op = op_named("prefix_attention");
  BenchSizes sizes;
  sizes.batch = batch, sizes.tokens = len, sizes.heads = heads;
  const OpShape shape = op.bench_shapes(sizes).front().with("kv_heads", kv_heads).with("head_dim", head_dim);
  OpBuffers buf(op, shape, DType::BF16);
  buf.draw(1);
  auto bf = [&](const char* name) { return static_cast<bf16*>(buf.ptr(name)); };
  auto f32 = [&](const char* name) { return static_cast<float*>(buf.ptr(name)); };
  const Buffers b{bf("q"), bf("k"), bf("v"),  bf("o"),  bf("dout"), bf("dq"),
                  f32("lse"), f32("dk"), f32("dv")};
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("attention_bench on %s: batch %lld, %lld query heads, %lld K/V heads of %lld, causal, bf16, median of %d\n",
              prop.name, (long long)batch, (long long)heads, (long long)kv_heads, (long long)head_dim, reps);

  Workspace w;
  for (Impl impl : {Impl::Cudnn, Impl::CudnnAtomic, Impl::Kernels}) {
    if (impl != Impl::Kernels) {
      const CudnnBackward mode = impl == Impl::CudnnAtomic ? CudnnBackward::AtomicDq : CudnnBackward::Deterministic;
      const std::string why = cudnn_attention_refusal(whole, mode);
      std::printf("\n%s: %s\n", impl_name(impl),
                  why.empty() ? cudnn_attention_describe(whole, mode).c_str() : ("not run: " + why).c_str());
      if (!why.empty()) continue;
    } else {
      std::printf("\n%s:\n", impl_name(impl));
    }
    std::printf("| tokens | forward ms | backward ms | fwd+bwd ms | fwd TFLOP/s | fwd+bwd TFLOP/s |\n");
    std::printf("| ---: | ---: | ---: | ---: | ---: | ---: |\n");
    const Times t = time_chunk(impl, whole, b, w, reps);
    const double f = op.pass("fwd").flops(shape), fb = f + op.pass("bwd").flops(shape);
    std::printf("| %lld | %.3f | %.3f | %.3f | %.1f | %.1f |\n", (long long)len, t.fwd, t.bwd, t.fwd + t.bwd,
                f / t.fwd * 1e-9, fb / (t.fwd + t.bwd) * 1e-9);
    if (chunk_len == 0 || batch != 1) continue;  // chunk rows are contiguous only for one sequence
    std::printf("\nOne chunk of %lld queries against the prefix (K/V rows 0 .. offset + chunk):\n",
                (long long)chunk_len);
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
      const Times tc = time_chunk(impl, d, bc, w, reps);
      const OpShape chunk = shape.with("offset", d.offset).with("len", d.len);
      sum += tc.fwd + tc.bwd;
      std::printf("| %lld | %lld | %.3f | %.3f | %.1f | %.1f |\n", (long long)c, (long long)d.offset, tc.fwd, tc.bwd,
                  op.pass("fwd").flops(chunk) / tc.fwd * 1e-9, op.pass("bwd").flops(chunk) / tc.bwd * 1e-9);
    }
    std::printf("sum over chunks, fwd+bwd: %.3f ms (whole sequence %.3f ms)\n", sum, t.fwd + t.bwd);
  }
  return 0;
}
