// Benchmark of the CUDA Mamba-3 chunk core: forward and forward+backward time (CUDA events,
// warm-up, median of repeats), TFLOP/s with the registry's FLOP count of the `M` core
// (mixers/mamba3/mamba3_mixer.cpp, sub-chunk 64 / R tokens), per-stage times and device memory.
// bf16 vectors, fp32 scalars and states, P = 64, N = 128, edges in and out (all four tensors).
// Shapes, inputs, FLOPs and the timed launches are the mamba3_core op's
// (mixers/mamba3/mamba3_core_op.cpp), the definition the kernel's CUDA test checks
// (tests/cuda/test_op_defs_cuda.cpp).
//
//   mamba3_core_bench [--batch 1] [--heads 32] [--len 32768,131072] [--rank 1,4] [--reps 20]
//                     [--chunk-len 2048,...] [--json FILE]
// --chunk-len (batch 1): also runs each length cut into chunks of these many tokens, the way
// the pipeline calls the core (the edge and its gradient carried from chunk to chunk, backward
// last chunk first, dD accumulated), one row per chunk length: the whole sequence's time and
// how many output bytes differ from one call (none at multiples of 64 tokens).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.cuh"
#include "kernels/cuda/op_buffers.h"
#include "kernels/op_def.h"
#include "mixers/mamba3/mamba3_core_cuda.h"

namespace {

using bf16 = __nv_bfloat16;
using stateflow::Mamba3Dims;
using namespace stateflow::bench;

constexpr int64_t P = 64, N = 128;

// Device arrays the chunked run adds to the op's, freed together.
struct Arena {
  std::vector<void*> ptrs;
  size_t bytes = 0;
  template <class T>
  T* alloc(size_t n) {
    T* p = nullptr;
    CK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
    ptrs.push_back(p);
    bytes += n * sizeof(T);
    return p;
  }
  ~Arena() {
    for (void* p : ptrs) cudaFree(p);
  }
};

struct Result {
  int64_t rank, len, chunk_len;  // chunk_len 0: one call
  float fwd_ms, fwdbwd_ms, stage_ms[9];  // contrib scan out | contrib' scan' contrib(dy) rscan fold grads
  float chunked_fwd_ms, chunked_fwdbwd_ms;
  unsigned long long chunked_bytes_differing, nonfinite;
  double fwd_tflops, fwdbwd_tflops, workspace_gib, total_gib, meminfo_gib;
};

// Shape, inputs, FLOPs and the timed launches come from the mamba3_core op
// (mixers/mamba3/mamba3_core_op.cpp), the definition its CUDA test checks against the float64
// recurrence.
Result run(int64_t B, int64_t H, int64_t T, int64_t R, int reps, int64_t chunk_len) {
  const stateflow::OpDef& op = stateflow::op_named("mamba3_core");
  stateflow::BenchSizes sizes;
  sizes.batch = B, sizes.heads = H, sizes.tokens = T;
  const stateflow::OpShape shape = op.bench_shapes(sizes).front().with("rank", R);
  Mamba3Dims d;
  d.batch = B, d.heads = H, d.len = T, d.rank = R, d.P = P, d.N = N, d.block = 64 / R;
  const int64_t nt = B * T * H, nx = nt * R * P, nb = nt * R * N, ns = B * H * P * N, nxp = B * H * R * P,
                nbp = B * H * R * N;
  size_t free0 = 0, free1 = 0, tot = 0;
  CK(cudaDeviceSynchronize());
  CK(cudaMemGetInfo(&free0, &tot));
  stateflow::OpBuffers buf(op, shape, stateflow::DType::BF16);
  buf.draw(1);
  Arena m;
  auto bf = [&](const char* name) { return static_cast<bf16*>(buf.ptr(name)); };
  auto f32 = [&](const char* name) { return static_cast<float*>(buf.ptr(name)); };
  bf16 *x = bf("x"), *b = bf("b"), *c = bf("c"), *dy = bf("dy"), *y = bf("y"), *dx = bf("dx"), *db = bf("db"),
       *dc = bf("dc");
  float *adt = f32("adt"), *dt = f32("dt"), *lam = f32("lam"), *D = f32("D"), *dadt = f32("dadt"), *ddt = f32("ddt"),
        *dlam = f32("dlam"), *dD = f32("dD");
  // Edges (forward in/out, gradients in/out): S, x_prev, b_prev each.
  float *S_in = f32("S_in"), *S_out = f32("S_out"), *dS_in = f32("dS_in"), *dS_out = f32("dS_out");
  float *xp_in = f32("xp_in"), *xp_out = f32("xp_out"), *dxp_in = f32("dxp_in"), *dxp_out = f32("dxp_out");
  float *bp_in = f32("bp_in"), *bp_out = f32("bp_out"), *dbp_in = f32("dbp_in"), *dbp_out = f32("dbp_out");
  const size_t ws_bytes = op.workspace_bytes(shape);
  void* ws = buf.workspace();
  unsigned long long* bad = m.alloc<unsigned long long>(1);
  CK(cudaDeviceSynchronize());
  CK(cudaMemGetInfo(&free1, &tot));

  const stateflow::Mamba3CudaInputs in{x, b, c, adt, dt, lam, D};
  auto fwd = [&] { buf.run(op.pass("fwd")); };
  auto bwd = [&] { buf.run(op.pass("bwd")); };
  auto time_it = [&](auto&& f) { return median_ms(f, reps); };
  Result r{};
  r.rank = R, r.len = T, r.chunk_len = chunk_len;
  r.fwd_ms = time_it(fwd);
  r.fwdbwd_ms = time_it([&] { fwd(), bwd(); });
  // Per-stage times: one synchronised run of each (Mamba3CudaConfig::stage_ms, a benchmark-only setting).
  stateflow::Mamba3CudaConfig timed;
  timed.stage_ms = r.stage_ms;
  stateflow::mamba3_chunk_forward_cuda(d, in, {S_in, xp_in, bp_in}, y, {S_out, xp_out, bp_out}, ws, nullptr, timed);
  timed.stage_ms = r.stage_ms + 3;
  stateflow::mamba3_chunk_backward_cuda(d, in, {S_in, xp_in, bp_in}, dy, {dS_out, dxp_out, dbp_out},
                                        {dx, db, dc, dadt, ddt, dlam, dD}, {dS_in, dxp_in, dbp_in}, ws, nullptr, timed);
  CK(cudaMemset(bad, 0, sizeof(*bad)));
  for (auto [p, n] : {std::pair{y, nx}, {dx, nx}, {db, nb}, {dc, nb}}) count_nonfinite<<<blocks(n, 256), 256>>>(p, n, bad);
  CK(cudaMemcpy(&r.nonfinite, bad, sizeof(*bad), cudaMemcpyDeviceToHost));

  if (chunk_len > 0) {
    // Chunk k covers tokens [k L, min((k+1) L, T)); the edge entering it and the gradient
    // leaving it are slot k of these chains (slot 0: the *_in arrays, slot n: the *_out ones).
    const int64_t n = (T + chunk_len - 1) / chunk_len;
    float *S_at = m.alloc<float>(size_t(n + 1) * ns), *xp_at = m.alloc<float>(size_t(n + 1) * nxp),
          *bp_at = m.alloc<float>(size_t(n + 1) * nbp), *dS_at = m.alloc<float>(size_t(n + 1) * ns),
          *dxp_at = m.alloc<float>(size_t(n + 1) * nxp), *dbp_at = m.alloc<float>(size_t(n + 1) * nbp);
    auto pick = [&](float* in0, float* out_n, float* chain, int64_t k, int64_t sz) {
      return k == 0 ? in0 : k == n ? out_n : chain + k * sz;
    };
    auto edge = [&](int64_t k) {
      return stateflow::Mamba3EdgeOut<float>{pick(S_in, S_out, S_at, k, ns), pick(xp_in, xp_out, xp_at, k, nxp),
                                             pick(bp_in, bp_out, bp_at, k, nbp)};
    };
    auto dedge = [&](int64_t k) {
      return stateflow::Mamba3EdgeOut<float>{pick(dS_in, dS_out, dS_at, k, ns), pick(dxp_in, dxp_out, dxp_at, k, nxp),
                                             pick(dbp_in, dbp_out, dbp_at, k, nbp)};
    };
    auto chunk = [&](int64_t k) {
      Mamba3Dims dk = d;
      dk.len = std::min(chunk_len, T - k * chunk_len);
      const int64_t t = k * chunk_len * H;
      return std::pair{dk, stateflow::Mamba3CudaInputs{x + t * R * P, b + t * R * N, c + t * R * N, adt + t, dt + t,
                                                       lam + t, D}};
    };
    auto ro = [](const stateflow::Mamba3EdgeOut<float>& e) { return stateflow::Mamba3Edge<float>{e.S, e.x_prev, e.b_prev}; };
    auto fwd_chunked = [&] {
      for (int64_t k = 0; k < n; ++k) {
        auto [dk, ink] = chunk(k);
        const int64_t t = k * chunk_len * H;
        stateflow::mamba3_chunk_forward_cuda(dk, ink, ro(edge(k)), y + t * R * P, edge(k + 1), ws, nullptr);
      }
    };
    auto bwd_chunked = [&] {
      for (int64_t k = n; k-- > 0;) {
        auto [dk, ink] = chunk(k);
        const int64_t t = k * chunk_len * H;
        stateflow::mamba3_chunk_backward_cuda(
            dk, ink, ro(edge(k)), dy + t * R * P, ro(dedge(k + 1)),
            {dx + t * R * P, db + t * R * N, dc + t * R * N, dadt + t, ddt + t, dlam + t, dD}, dedge(k), ws, nullptr);
      }
    };
    r.chunked_fwd_ms = time_it(fwd_chunked);
    r.chunked_fwdbwd_ms = time_it([&] { fwd_chunked(), bwd_chunked(); });
    // One call's outputs, kept to compare with the chunked ones byte for byte (dD from zero).
    struct Out {
      void* p;
      int64_t bytes;
    };
    const std::vector<Out> outs = {{y, nx * 2},      {dx, nx * 2},    {db, nb * 2},        {dc, nb * 2},
                                   {dadt, nt * 4},   {ddt, nt * 4},   {dlam, nt * 4},      {dD, H * 4},
                                   {S_out, ns * 4},  {xp_out, nxp * 4}, {bp_out, nbp * 4}, {dS_in, ns * 4},
                                   {dxp_in, nxp * 4}, {dbp_in, nbp * 4}};
    CK(cudaMemset(dD, 0, H * 4));
    fwd(), bwd();
    std::vector<unsigned char*> ref;
    for (const Out& o : outs) {
      ref.push_back(m.alloc<unsigned char>(size_t(o.bytes)));
      CK(cudaMemcpy(ref.back(), o.p, o.bytes, cudaMemcpyDeviceToDevice));
    }
    CK(cudaMemset(dD, 0, H * 4));
    fwd_chunked(), bwd_chunked();
    CK(cudaMemset(bad, 0, sizeof(*bad)));
    for (size_t i = 0; i < outs.size(); ++i)
      count_differences<<<blocks(outs[i].bytes, 256), 256>>>(static_cast<const unsigned char*>(outs[i].p), ref[i],
                                                              outs[i].bytes, bad);
    CK(cudaMemcpy(&r.chunked_bytes_differing, bad, sizeof(*bad), cudaMemcpyDeviceToHost));
  }

  const double f_fwd = op.pass("fwd").flops(shape), f_bwd = op.pass("bwd").flops(shape);
  r.fwd_tflops = f_fwd / (r.fwd_ms * 1e-3) / 1e12;
  r.fwdbwd_tflops = (f_fwd + f_bwd) / (r.fwdbwd_ms * 1e-3) / 1e12;
  r.workspace_gib = ws_bytes / double(1 << 30);
  r.total_gib = (buf.bytes() + m.bytes) / double(1 << 30);
  r.meminfo_gib = (free0 - free1) / double(1 << 30);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t B = 1, H = 32;
  std::vector<int64_t> lens = {32768, 131072}, ranks = {1, 4}, chunk_lens;
  int reps = 20;
  const char* json = nullptr;
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "option %s needs a value (see the header of mamba3_core_bench.cu)\n", argv[i]);
      return 2;
    }
    if (a == "--batch") B = std::atoll(argv[i + 1]);
    else if (a == "--heads") H = std::atoll(argv[i + 1]);
    else if (a == "--len") lens = parse_list(argv[i + 1]);
    else if (a == "--rank") ranks = parse_list(argv[i + 1]);
    else if (a == "--reps") reps = std::atoi(argv[i + 1]);
    else if (a == "--chunk-len") chunk_lens = parse_list(argv[i + 1]);
    else if (a == "--json") json = argv[i + 1];
    else {
      std::fprintf(stderr, "unknown option %s (see the header of mamba3_core_bench.cu)\n", argv[i]);
      return 2;
    }
  }
  for (int64_t L : chunk_lens)
    if (L < 1 || B != 1) {
      std::fprintf(stderr, "--chunk-len needs positive lengths and --batch 1 (a chunk of batch 1 is contiguous)\n");
      return 2;
    }
  if (B < 1 || H < 1 || reps < 1) {
    std::fprintf(stderr, "--batch, --heads and --reps must be >= 1\n");
    return 2;
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("Mamba-3 core (CUDA) benchmark on %s (%d SMs): bf16, batch %lld, heads %lld, P = 64, N = 128, "
              "64-row sub-chunks, edges in and out, median of %d\n",
              prop.name, prop.multiProcessorCount, (long long)B, (long long)H, reps);
  std::vector<Result> res;
  for (int64_t R : ranks)
    for (int64_t T : lens) {
      std::printf("  rank %lld, T = %lld ...\n", (long long)R, (long long)T);
      std::fflush(stdout);
      res.push_back(run(B, H, T, R, reps, 0));
      for (int64_t L : chunk_lens) res.push_back(run(B, H, T, R, reps, L));
    }
  std::printf("\n%4s %8s | %8s %7s | %8s %7s | %17s | %35s | %6s %6s %6s | %s\n", "R", "T", "fwd ms", "TFLOP/s",
              "f+b ms", "TFLOP/s", "ctb   scan  out", "ctb'  scan' ctbdy rscan fold  grads", "wsGiB", "allGiB",
              "memGiB", "nonfinite");
  for (const Result& r : res) {
    if (r.chunk_len) continue;
    std::printf("%4lld %8lld | %8.3f %7.1f | %8.3f %7.1f | %5.3f %5.3f %5.3f | %5.3f %5.3f %5.3f %5.3f %5.3f %5.3f | "
                "%6.2f %6.2f %6.2f | %llu\n",
                (long long)r.rank, (long long)r.len, r.fwd_ms, r.fwd_tflops, r.fwdbwd_ms, r.fwdbwd_tflops,
                r.stage_ms[0], r.stage_ms[1], r.stage_ms[2], r.stage_ms[3], r.stage_ms[4], r.stage_ms[5],
                r.stage_ms[6], r.stage_ms[7], r.stage_ms[8], r.workspace_gib, r.total_gib, r.meminfo_gib,
                r.nonfinite);
  }
  if (!chunk_lens.empty()) {
    std::printf("\nIn chunks (edge carried; backward last chunk first), against one call on the same inputs:\n");
    std::printf("%4s %8s %8s | %8s %8s | %8s %8s | %s\n", "R", "T", "chunk", "fwd ms", "x 1 call", "f+b ms",
                "x 1 call", "bytes differing from one call");
    const Result* whole = nullptr;
    for (const Result& r : res) {
      if (!r.chunk_len) {
        whole = &r;
        continue;
      }
      std::printf("%4lld %8lld %8lld | %8.3f %8.2f | %8.3f %8.2f | %llu\n", (long long)r.rank, (long long)r.len,
                  (long long)r.chunk_len, r.chunked_fwd_ms, r.chunked_fwd_ms / whole->fwd_ms, r.chunked_fwdbwd_ms,
                  r.chunked_fwdbwd_ms / whole->fwdbwd_ms, r.chunked_bytes_differing);
    }
  }
  if (json) {
    FILE* f = std::fopen(json, "w");
    if (!f) {
      std::fprintf(stderr, "cannot write %s\n", json);
      return 1;
    }
    std::fprintf(f, "{\"device\": \"%s\", \"batch\": %lld, \"heads\": %lld, \"results\": [\n", prop.name,
                 (long long)B, (long long)H);
    for (size_t i = 0; i < res.size(); ++i) {
      const Result& r = res[i];
      std::fprintf(f,
                   "  {\"rank\": %lld, \"len\": %lld, \"fwd_ms\": %.4f, \"fwd_tflops\": %.2f, \"fwdbwd_ms\": %.4f, "
                   "\"fwdbwd_tflops\": %.2f, \"stage_ms\": [%.4f, %.4f, %.4f, %.4f, %.4f, %.4f, %.4f, %.4f, %.4f], "
                   "\"workspace_gib\": %.3f, \"allocated_gib\": %.3f, \"nonfinite\": %llu, \"chunk_len\": %lld, "
                   "\"chunked_fwd_ms\": %.4f, \"chunked_fwdbwd_ms\": %.4f, \"chunked_bytes_differing\": %llu}%s\n",
                   (long long)r.rank, (long long)r.len, r.fwd_ms, r.fwd_tflops, r.fwdbwd_ms, r.fwdbwd_tflops,
                   r.stage_ms[0], r.stage_ms[1], r.stage_ms[2], r.stage_ms[3], r.stage_ms[4], r.stage_ms[5],
                   r.stage_ms[6], r.stage_ms[7], r.stage_ms[8], r.workspace_gib, r.total_gib, r.nonfinite,
                   (long long)r.chunk_len, r.chunked_fwd_ms, r.chunked_fwdbwd_ms, r.chunked_bytes_differing,
                   i + 1 < res.size() ? "," : "");
    }
    std::fprintf(f, "]}\n");
    std::fclose(f);
  }
  return 0;
}
