// Benchmark of the CUDA Mamba-3 chunk core: forward and forward+backward time (CUDA events,
// warm-up, median of repeats), TFLOP/s with the registry's FLOP count of the `M` core
// (mixers/mamba3/mamba3_mixer.cpp, sub-chunk 64 / R tokens), per-stage times and device memory.
// bf16 vectors, fp32 scalars and states, P = 64, N = 128, edges in and out (all four tensors).
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
#include "mixers/mamba3/mamba3_core_cuda.h"
#include "model/flops.h"
#include "model/mixer.h"

namespace {

using bf16 = __nv_bfloat16;
using stateflow::Mamba3Dims;
using namespace stateflow::bench;

constexpr int64_t P = 64, N = 128;

template <class T>
__global__ void init_normal(T* x, int64_t n, float scale, uint64_t seed) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = T(scale * hash_normal(i, seed));
}

// The layer's scalars: dt = softplus(. + dt_bias) with dt_bias per head for dt in [1e-3, 1e-1],
// A in [-16, -1] per head, lam = sigmoid(.).
__global__ void init_scalars(float* adt, float* dt, float* lam, int64_t n, int heads, uint64_t seed) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int h = int(i % heads);
  const float A = -(1.f + 15.f * hash_uniform(h, seed + 7)), dt0 = 0.001f + 0.099f * hash_uniform(h, seed + 8);
  const float d = log1pf(expf(0.5f * hash_normal(i, seed) + logf(expm1f(dt0))));
  dt[i] = d, adt[i] = A * d, lam[i] = 1.f / (1.f + expf(-hash_normal(i, seed + 1)));
}

// Device arrays of one run, freed together.
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

Result run(int64_t B, int64_t H, int64_t T, int64_t R, int reps, int64_t chunk_len) {
  Mamba3Dims d;
  d.batch = B, d.heads = H, d.len = T, d.rank = R, d.P = P, d.N = N, d.block = 64 / R;
  const int64_t nt = B * T * H, nx = nt * R * P, nb = nt * R * N, ns = B * H * P * N, nxp = B * H * R * P,
                nbp = B * H * R * N;
  size_t free0 = 0, free1 = 0, tot = 0;
  CK(cudaDeviceSynchronize());
  CK(cudaMemGetInfo(&free0, &tot));
  Arena m;
  bf16 *x = m.alloc<bf16>(nx), *b = m.alloc<bf16>(nb), *c = m.alloc<bf16>(nb), *dy = m.alloc<bf16>(nx);
  bf16 *y = m.alloc<bf16>(nx), *dx = m.alloc<bf16>(nx), *db = m.alloc<bf16>(nb), *dc = m.alloc<bf16>(nb);
  float *adt = m.alloc<float>(nt), *dt = m.alloc<float>(nt), *lam = m.alloc<float>(nt), *D = m.alloc<float>(H);
  float *dadt = m.alloc<float>(nt), *ddt = m.alloc<float>(nt), *dlam = m.alloc<float>(nt), *dD = m.alloc<float>(H);
  // Edges (forward in/out, gradients in/out): S, x_prev, b_prev each.
  float *S_in = m.alloc<float>(ns), *S_out = m.alloc<float>(ns), *dS_in = m.alloc<float>(ns), *dS_out = m.alloc<float>(ns);
  float *xp_in = m.alloc<float>(nxp), *xp_out = m.alloc<float>(nxp), *dxp_in = m.alloc<float>(nxp),
        *dxp_out = m.alloc<float>(nxp);
  float *bp_in = m.alloc<float>(nbp), *bp_out = m.alloc<float>(nbp), *dbp_in = m.alloc<float>(nbp),
        *dbp_out = m.alloc<float>(nbp);
  const size_t ws_bytes = stateflow::mamba3_cuda_workspace_bytes(d);
  char* ws = m.alloc<char>(ws_bytes);
  unsigned long long* bad = m.alloc<unsigned long long>(1);
  init_normal<<<blocks(nx, 256), 256>>>(x, nx, 1.f, 1);
  init_normal<<<blocks(nb, 256), 256>>>(b, nb, 0.3f, 2);
  init_normal<<<blocks(nb, 256), 256>>>(c, nb, 0.3f, 3);
  init_normal<<<blocks(nx, 256), 256>>>(dy, nx, 1.f, 4);
  init_scalars<<<blocks(nt, 256), 256>>>(adt, dt, lam, nt, int(H), 5);
  init_normal<<<1, 256>>>(D, H, 1.f, 6);
  init_normal<<<blocks(ns, 256), 256>>>(S_in, ns, 0.5f, 7);
  init_normal<<<blocks(ns, 256), 256>>>(dS_out, ns, 1.f, 8);
  init_normal<<<blocks(nxp, 256), 256>>>(xp_in, nxp, 1.f, 9);
  init_normal<<<blocks(nbp, 256), 256>>>(bp_in, nbp, 0.3f, 10);
  init_normal<<<blocks(nxp, 256), 256>>>(dxp_out, nxp, 1.f, 11);
  init_normal<<<blocks(nbp, 256), 256>>>(dbp_out, nbp, 1.f, 12);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  CK(cudaMemGetInfo(&free1, &tot));

  const stateflow::Mamba3CudaInputs in{x, b, c, adt, dt, lam, D};
  auto fwd = [&](const stateflow::Mamba3CudaConfig& cfg) {
    stateflow::mamba3_chunk_forward_cuda(d, in, {S_in, xp_in, bp_in}, y, {S_out, xp_out, bp_out}, ws, nullptr, cfg);
  };
  auto bwd = [&](const stateflow::Mamba3CudaConfig& cfg) {
    stateflow::mamba3_chunk_backward_cuda(d, in, {S_in, xp_in, bp_in}, dy, {dS_out, dxp_out, dbp_out},
                                          {dx, db, dc, dadt, ddt, dlam, dD}, {dS_in, dxp_in, dbp_in}, ws, nullptr, cfg);
  };
  auto time_it = [&](auto&& f) { return median_ms(f, reps); };
  Result r{};
  r.rank = R, r.len = T, r.chunk_len = chunk_len;
  r.fwd_ms = time_it([&] { fwd({}); });
  r.fwdbwd_ms = time_it([&] { fwd({}), bwd({}); });
  stateflow::Mamba3CudaConfig timed;  // per-stage times: one synchronised run of each
  timed.stage_ms = r.stage_ms;
  fwd(timed);
  timed.stage_ms = r.stage_ms + 3;
  bwd(timed);
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
    fwd({}), bwd({});
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

  // The M row's core count for one head (sub-chunk 64 / R tokens), nt = tokens x heads.
  stateflow::ModelConfig one_head;
  one_head.pattern = "M";
  one_head.mixers["mamba3"] = {{"heads", 1}, {"head_dim", P}, {"state_size", N}, {"rank", R}, {"block_size", 64 / R}};
  one_head.complete_sections();
  const stateflow::MixerFlops f = stateflow::mixer_for_letter('M').flops_per_token(one_head);
  r.fwd_tflops = f.core_forward * nt / (r.fwd_ms * 1e-3) / 1e12;
  r.fwdbwd_tflops = (f.core_forward + f.core_backward) * nt / (r.fwdbwd_ms * 1e-3) / 1e12;
  r.workspace_gib = ws_bytes / double(1 << 30);
  r.total_gib = m.bytes / double(1 << 30);
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
