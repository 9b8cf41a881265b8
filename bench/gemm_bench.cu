// Benchmark of the pinned GEMM algorithms at the row counts the pipeline's chunks give
// (kernels/cuda/gemm_cuda.h): for each bf16 projection of a gdn-1.3b block, forward (y = x W) and
// input gradient (dx = dy W^T), the cuBLASLt heuristic's first --count algorithms as the pinning
// considers them -- for aligned rows chosen at 2048 rows without split-K, for short rows at 1024
// rows with deterministic split-K -- each timed (CUDA events, median of --reps after 3 warm-ups)
// at 1K, 2K and 32K rows (short ones at 1K and 1.5K). The first of each list is the pinned one.
// The summary's "per 1K" columns are the time per 1024 rows, so a GEMM as fast per row at short
// chunks as at 32K reads the same in all of them.
//
//   gemm_bench [--count 8] [--reps 10] [--dim 2048] [--mlp 5632] [--heads 16]
//
// --dim: the model width (the GDN's q, k, v, z projection is 4 x dim wide: heads of 128 with
// 128 x heads = dim); --mlp: the MLP's hidden width F (W1 | W3 fused: 2F); --heads: the width
// of the GDN's a, b gate projections.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_util.cuh"
#include "kernels/cuda/gemm_cuda.h"

namespace {

using namespace stateflow;
using namespace stateflow::bench;
using bf16 = __nv_bfloat16;

struct Product {
  std::string name;
  bool trans_b;  // the input gradient dx = dy W^T
  int64_t N, K;
};

__global__ void fill_kernel(bf16* p, int64_t n, uint64_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16(hash_normal(uint64_t(i), seed));
}

bf16* random_bf16(int64_t n, uint64_t seed) {
  bf16* p = nullptr;
  CK(cudaMalloc(&p, size_t(n) * sizeof(bf16)));
  fill_kernel<<<std::min(blocks(n, 256), 4096u), 256>>>(p, n, seed);
  CK(cudaGetLastError());
  return p;
}

// Each candidate's median ms at each row count (-1 where it cannot run it), one line each.
std::vector<std::vector<double>> time_candidates(const CublasGemm& g, const Product& p, const char* what,
                                                 const std::vector<GemmCandidate>& cands,
                                                 const std::vector<int64_t>& rows, const bf16* A, const bf16* B,
                                                 bf16* C, int reps) {
  std::vector<std::vector<double>> ms;
  for (size_t i = 0; i < cands.size(); ++i) {
    std::printf("  %-8s #%zu %-62s", what, i, cands[i].config.c_str());
    ms.emplace_back();
    for (int64_t M : rows) {
      const auto call = gemm_candidate_call(g, cands[i], p.trans_b, M, p.N, p.K, A, B, C);
      ms.back().push_back(call ? double(median_ms(call, reps)) : -1.0);
      std::printf(" %6lld: %8.4f ms", (long long)M, ms.back().back());
    }
    std::printf("%s\n", i == 0 ? "  <- pinned" : "");
    std::fflush(stdout);
  }
  return ms;
}

}  // namespace

int main(int argc, char** argv) {
  int count = 8, reps = 10;
  int64_t dim = 2048, mlp = 5632, heads = 16;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "usage: gemm_bench [--count 8] [--reps 10] [--dim 2048] [--mlp 5632] [--heads 16]\n");
      return 2;
    }
    const long long v = std::atoll(argv[++i]);
    if (a == "--count") count = int(v);
    else if (a == "--reps") reps = int(v);
    else if (a == "--dim") dim = v;
    else if (a == "--mlp") mlp = v;
    else if (a == "--heads") heads = v;
    else {
      std::fprintf(stderr, "gemm_bench: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (count < 1 || reps < 1 || dim < 1 || mlp < 1 || heads < 1) {
    std::fprintf(stderr, "gemm_bench: --count, --reps, --dim, --mlp, --heads must be >= 1\n");
    return 2;
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs; bf16 operands and results, fp32 accumulation; median of %d\n", prop.name,
              prop.multiProcessorCount, reps);

  const std::vector<Product> products = {
      {"gdn.in_proj fwd (q,k,v,z)", false, 4 * dim, dim}, {"gdn.in_proj dgrad", true, dim, 4 * dim},
      {"gdn.gate_proj fwd (a or b)", false, heads, dim},  {"gdn.gate_proj dgrad", true, dim, heads},
      {"gdn.out_proj fwd", false, dim, dim},              {"gdn.out_proj dgrad", true, dim, dim},
      {"mlp.up_proj fwd (W1 or W3)", false, mlp, dim},    {"mlp.up_proj dgrad (W1 or W3)", true, dim, mlp},
      {"mlp.up_proj fwd (W1|W3)", false, 2 * mlp, dim},   {"mlp.up_proj dgrad (W1|W3)", true, dim, 2 * mlp},
      {"mlp.down_proj fwd", false, dim, mlp},             {"mlp.down_proj dgrad", true, mlp, dim}};
  const std::vector<int64_t> aligned_rows = {1024, 2048, 32768}, short_rows = {1024, 1536};
  int64_t widest = 0;
  for (const Product& p : products) widest = std::max({widest, p.N, p.K});
  const bf16* A = random_bf16(32768 * widest, 1);
  const bf16* B = random_bf16(widest * widest, 2);
  bf16* C = random_bf16(32768 * widest, 3);
  CublasGemm g;

  struct Summary {
    std::string name;
    double at32k, at2k, aligned1k, short1k, best1k;
  };
  std::vector<Summary> rows;
  for (const Product& p : products) {
    std::printf("%s: N %lld, K %lld\n", p.name.c_str(), (long long)p.N, (long long)p.K);
    const auto aligned = gemm_candidates(g, p.trans_b, p.N, p.K, 2048, false, count);
    const auto shorts = gemm_candidates(g, p.trans_b, p.N, p.K, 1024, true, count);
    const auto a_ms = time_candidates(g, p, "aligned", aligned, aligned_rows, A, B, C, reps);
    const auto s_ms = time_candidates(g, p, "short", shorts, short_rows, A, B, C, reps);
    double best = a_ms[0][0];
    for (const auto& m : a_ms) best = m[0] > 0 ? std::min(best, m[0]) : best;
    for (const auto& m : s_ms) best = m[0] > 0 ? std::min(best, m[0]) : best;
    rows.push_back({p.name, a_ms[0][2] / 32, a_ms[0][1] / 2, a_ms[0][0], s_ms[0][0], best});
  }
  std::printf("\n| product | per 1K rows at 32K (ms) | per 1K at 2K | 1K, aligned pin | 1K, short pin | best at 1K "
              "| short pin / 32K per 1K |\n|---|---:|---:|---:|---:|---:|---:|\n");
  for (const Summary& s : rows)
    std::printf("| %s | %.4f | %.4f | %.4f | %.4f | %.4f | %.2f |\n", s.name.c_str(), s.at32k, s.at2k, s.aligned1k,
                s.short1k, s.best1k, s.short1k / s.at32k);
  return 0;
}
