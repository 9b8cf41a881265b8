// Benchmark of the CUDA GDN chunk core: forward and forward+backward time (CUDA events,
// warm-up, median of repeats), TFLOP/s with MATH.md section 9's FLOP counts, per-stage
// times and device memory. bf16, dk = dv = 128, C = 64. Backward is timed four ways: the
// default (recomputes Pre and the forward sweep), with GdnCudaConfig::kept_T (B1 forms W and U
// from the forward's T, as the layer runs it), with kept_T and kept_sweep (also no forward sweep
// beside B3, as the layer runs it with gdn.keep_sweep: "kS") and with GdnCudaConfig::saved_forward.
// Shapes, inputs, FLOPs and the timed launches are the gdn_core op's (mixers/gdn/gdn_core_op.cpp),
// the definition the kernel's CUDA test checks (tests/cuda/test_op_defs_cuda.cpp).
//
//   gdn_core_bench [--batch 1] [--heads 16] [--len 8192,32768,131072] [--reps 20]
//                  [--sweep default,rows,tiles] [--sweep-key-split 0] [--sweep-warps 0] [--value-tile 0]
//                  [--split default,off,512,...] [--piece-tile 0] [--b4-slab 0,16,32,64]
//                  [--chunk-len 1024,2048,...] [--overlap default,off,on] [--overlap-segment 0,16,32]
//                  [--overlap-streams 0,1,2] [--json FILE]
// --sweep: the unsplit core's sweeps to run, each over every --split and --len: "default"
// (STATEFLOW_GDN_SWEEP, rows when unset), "rows" (each warp keeps 16 state rows in registers)
// or "tiles" (the earlier tile sweeps). --sweep-key-split: warps per 16 state rows of the row
// sweeps (1, 2, 4; 0 = core's); --sweep-warps: warps per row-sweep block (2, 4, 8; 0 = core's).
// --split: the sweeps' piece lengths to run, each over every --len: "default" (what the core
// does unasked: STATEFLOW_GDN_PIECE_LEN, unsplit when unset), "off" (the unsplit sequential
// sweeps) or tokens per piece (a multiple of 64). --piece-tile: rows per piece-sweep block (32, 64, 128; 0 = core's).
// --b4-slab: value rows of the state B4 streams at a time, each over every --sweep, --split and --len
// (0 = core's: 16, two blocks per SM; 64 keeps one block per SM as the earlier kernel did).
// --overlap: the backward's B3 overlapped with B4 (GdnCudaConfig::overlap): "default" (the lever
// core_overlap), "off" or "on", each over every other setting; --overlap-segment: sub-chunks per
// segment (0 = core's), each over every --overlap; --overlap-streams: streams the B4 launches take
// turns on (0 = core's), each over every segment. Overlapped, the per-stage B3 column includes B4
// (B4 reads 0).
// After the main table, one per stage of every unsplit one-call row: time, the bytes the stage's kernels
// must move (gdn_cuda_stage_cost) over it (GB/s, against the H200's 4.8 TB/s) and its tensor-core
// FLOP rate, for the default backward (recomputing the forward).
// --chunk-len (batch 1): also runs each length cut into chunks of these many tokens, the way
// the pipeline calls the core (state S and its gradient carried from chunk to chunk, backward
// last chunk first), one row per chunk length: the whole sequence's time, also with each chunk's
// T kept from its forward to its backward (as the layer does), and with its T and forward sweep
// kept (gdn.keep_sweep), and whether the outputs are bitwise those of the unchunked call in all
// three (they must be at multiples of C = 64).
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
#include "mixers/gdn/gdn_core_cuda.h"

namespace {

using bf16 = __nv_bfloat16;
using stateflow::GdnDims;
using namespace stateflow::bench;

template <class T>
T* dalloc(size_t n, size_t& total) {
  T* p = nullptr;
  CK(cudaMalloc(&p, n * sizeof(T)));
  total += n * sizeof(T);
  return p;
}

struct Result {
  int64_t len, chunk_len;  // chunk_len 0: one call
  int piece_len;           // 0: unsplit
  int sweep;               // GdnCudaConfig::Sweep as resolved (meaningful when unsplit)
  int b4_slab;             // GdnCudaConfig::b4_slab as asked (0: the core's)
  int overlap, overlap_segment, overlap_streams;  // GdnCudaConfig::overlap, overlap_segment, overlap_streams as asked
  stateflow::GdnStageCost cost;  // of the default (recomputing) backward
  float chunked_fwd_ms, chunked_fwdbwd_ms, chunked_fwdbwd_kept_ms, chunked_fwdbwd_sweep_ms;
  // in o, dq, dk, dv, dbeta, dg, S_out, dS_in; recomputing T, with T kept, with T and the sweep kept
  unsigned long long chunked_bytes_differing, chunked_kept_bytes_differing, chunked_sweep_bytes_differing;
  // Pre ST Out | B1 B2 B3 B4 | same, saved | same, kept T | same, kept T and sweep
  float fwd_ms, fwdbwd_ms, fwdbwd_saved_ms, fwdbwd_kept_ms, fwdbwd_sweep_ms, stage_ms[19];
  double fwd_tflops, fwdbwd_tflops, fwdbwd_saved_tflops, fwdbwd_kept_tflops, fwdbwd_sweep_tflops, workspace_gib,
      total_gib, meminfo_gib;
  unsigned long long nonfinite;
};

// Shape, inputs, FLOPs and the timed launches come from the gdn_core op (mixers/gdn/gdn_core_op.cpp),
// the definition its CUDA test checks against the float64 recurrence; cfg's tiles and piece
// length become the shape's.
Result run(int64_t B, int64_t H, int64_t T, int reps, const stateflow::GdnCudaConfig& cfg, int64_t chunk_len) {
  const stateflow::OpDef& op = stateflow::op_named("gdn_core");
  stateflow::BenchSizes sizes;
  sizes.batch = B, sizes.heads = H, sizes.tokens = T;
  const stateflow::OpShape shape = op.bench_shapes(sizes)
                                       .front()
                                       .with("sweep", cfg.sweep)
                                       .with("sweep_key_split", cfg.sweep_key_split)
                                       .with("sweep_warps", cfg.sweep_warps)
                                       .with("value_tile", cfg.value_tile)
                                       .with("piece_len", cfg.piece_len)
                                       .with("piece_tile", cfg.piece_tile)
                                       .with("b4_slab", cfg.b4_slab)
                                       .with("overlap", cfg.overlap)
                                       .with("overlap_segment", cfg.overlap_segment)
                                       .with("overlap_streams", cfg.overlap_streams);
  GdnDims d;
  d.batch = B, d.heads = H, d.len = T, d.dk = 128, d.dv = 128, d.block = 64, d.scale = 1.0 / std::sqrt(128.0);
  const int64_t nt = B * T * H, nk = nt * 128, ns = B * H * 128 * 128;
  size_t free0 = 0, free1 = 0, tot = 0, bytes = 0;
  CK(cudaDeviceSynchronize());
  CK(cudaMemGetInfo(&free0, &tot));
  stateflow::OpBuffers buf(op, shape, stateflow::DType::BF16);
  buf.draw(1);
  bytes += buf.bytes();
  auto bf = [&](const char* name) { return static_cast<bf16*>(buf.ptr(name)); };
  auto f32 = [&](const char* name) { return static_cast<float*>(buf.ptr(name)); };
  bf16 *q = bf("q"), *k = bf("k"), *v = bf("v"), *dO = bf("dO"), *o = bf("o"), *dq = bf("dq"), *dk = bf("dk"),
       *dv = bf("dv");
  float *beta = f32("beta"), *g = f32("g"), *dbeta = f32("dbeta"), *dg = f32("dg"), *S_in = f32("S_in"),
        *S_out = f32("S_out"), *dS_out = f32("dS_out"), *dS_in = f32("dS_in");
  const size_t ws_bytes = op.workspace_bytes(shape);
  void* ws = buf.workspace();
  unsigned long long* bad = dalloc<unsigned long long>(1, bytes);
  CK(cudaDeviceSynchronize());
  CK(cudaMemGetInfo(&free1, &tot));

  auto fwd = [&] { buf.run(op.pass("fwd")); };
  auto bwd = [&] { buf.run(op.pass("bwd")); };
  auto bwd_saved = [&] { buf.run(op.pass("bwd saved")); };
  auto bwd_kept = [&] { buf.run(op.pass("bwd kept T")); };
  auto bwd_sweep = [&] { buf.run(op.pass("bwd kept sweep")); };
  auto time_it = [&](auto&& f) { return median_ms(f, reps); };
  Result r{};
  r.len = T;
  r.piece_len = stateflow::gdn_cuda_piece_len(d, cfg);
  r.sweep = cfg.sweep ? cfg.sweep : stateflow::gdn_cuda_default_sweep();
  r.b4_slab = cfg.b4_slab;
  r.overlap = cfg.overlap, r.overlap_segment = cfg.overlap_segment, r.overlap_streams = cfg.overlap_streams;
  r.cost = stateflow::gdn_cuda_stage_cost(d, false);
  r.fwd_ms = time_it(fwd);
  r.fwdbwd_ms = time_it([&] { fwd(), bwd(); });
  r.fwdbwd_saved_ms = time_it([&] { fwd(), bwd_saved(); });
  r.fwdbwd_kept_ms = time_it([&] { fwd(), bwd_kept(); });
  r.fwdbwd_sweep_ms = time_it([&] { fwd(), bwd_sweep(); });
  // Per-stage times: one synchronised run of each (GdnCudaConfig::stage_ms, a benchmark-only setting).
  stateflow::GdnCudaConfig timed = cfg;
  auto bwd_timed = [&] {
    stateflow::gdn_chunk_backward_cuda(d, q, k, v, beta, g, S_in, dO, dS_out, dq, dk, dv, dbeta, dg, dS_in, ws,
                                       nullptr, timed);
  };
  timed.stage_ms = r.stage_ms;
  stateflow::gdn_chunk_forward_cuda(d, q, k, v, beta, g, S_in, o, S_out, ws, nullptr, timed);
  timed.stage_ms = r.stage_ms + 3;
  bwd_timed();
  timed.stage_ms = r.stage_ms + 7;
  timed.saved_forward = true;
  bwd_timed();
  timed.stage_ms = r.stage_ms + 11;
  timed.saved_forward = false, timed.kept_T = true;
  bwd_timed();
  timed.stage_ms = r.stage_ms + 15;
  timed.kept_sweep = true;
  bwd_timed();
  CK(cudaMemset(bad, 0, sizeof(*bad)));
  for (bf16* x : {o, dq, dk, dv}) count_nonfinite<<<blocks(nk, 256), 256>>>(x, nk, bad);
  CK(cudaMemcpy(&r.nonfinite, bad, sizeof(*bad), cudaMemcpyDeviceToHost));
  r.chunk_len = chunk_len;
  if (chunk_len > 0) {
    // Chunk c covers tokens [c L, min((c+1) L, T)); its entering state and the gradient leaving
    // it live in S_at / dS_at (c = 0's are S_in and dS_in, the last chunk's S_out and dS_out).
    const int64_t n = (T + chunk_len - 1) / chunk_len;
    size_t chain_bytes = 0;
    float *S_at = dalloc<float>(size_t(n + 1) * ns, chain_bytes), *dS_at = dalloc<float>(size_t(n + 1) * ns, chain_bytes);
    auto chunk = [&](int64_t c) {
      GdnDims dc = d;
      dc.len = std::min(chunk_len, T - c * chunk_len);
      return dc;
    };
    // Each chunk's T, kept from its forward to its backward (the last chunk's slot may be longer than it).
    const size_t T_elems = stateflow::gdn_cuda_kept_T_bytes(chunk(0)) / sizeof(bf16);
    bf16* T_kept = dalloc<bf16>(size_t(n) * T_elems, chain_bytes);
    // And each chunk's forward sweep (V_new and entering states), likewise.
    const size_t sweep_bytes = stateflow::gdn_cuda_kept_sweep_bytes(chunk(0));
    char* sweep_kept = dalloc<char>(size_t(n) * sweep_bytes, chain_bytes);
    auto S_of = [&](int64_t c) { return c == 0 ? S_in : c == n ? S_out : S_at + c * ns; };
    auto dS_of = [&](int64_t c) { return c == 0 ? dS_in : c == n ? dS_out : dS_at + c * ns; };
    // keep_T (keep_sweep): chunk c's forward writes its T (forward sweep) to its slot and its
    // backward reads it from there.
    auto with_T = [&](int64_t c, bool keep_T, bool keep_sweep, bool backward) {
      stateflow::GdnCudaConfig at = cfg;
      if (keep_T) at.T_buffer = T_kept + size_t(c) * T_elems, at.kept_T = backward;
      if (keep_sweep) at.sweep_buffer = sweep_kept + size_t(c) * sweep_bytes, at.kept_sweep = backward;
      return at;
    };
    auto fwd_chunked = [&](bool keep_T, bool keep_sweep) {
      for (int64_t c = 0; c < n; ++c) {
        const int64_t t = c * chunk_len * H;
        stateflow::gdn_chunk_forward_cuda(chunk(c), q + t * 128, k + t * 128, v + t * 128, beta + t, g + t, S_of(c),
                                          o + t * 128, S_of(c + 1), ws, nullptr, with_T(c, keep_T, keep_sweep, false));
      }
    };
    auto bwd_chunked = [&](bool keep_T, bool keep_sweep) {
      for (int64_t c = n; c-- > 0;) {
        const int64_t t = c * chunk_len * H;
        stateflow::gdn_chunk_backward_cuda(chunk(c), q + t * 128, k + t * 128, v + t * 128, beta + t, g + t, S_of(c),
                                           dO + t * 128, dS_of(c + 1), dq + t * 128, dk + t * 128, dv + t * 128,
                                           dbeta + t, dg + t, dS_of(c), ws, nullptr,
                                           with_T(c, keep_T, keep_sweep, true));
      }
    };
    // The unchunked outputs, kept to compare with the chunked ones byte for byte.
    struct Out {
      void* p;
      int64_t bytes;
    };
    const std::vector<Out> outs = {{o, nk * 2}, {dq, nk * 2}, {dk, nk * 2}, {dv, nk * 2}, {dbeta, nt * 4},
                                   {dg, nt * 4}, {S_out, ns * 4}, {dS_in, ns * 4}};
    fwd(), bwd();
    std::vector<unsigned char*> ref;
    size_t ref_bytes = 0;
    for (const Out& x : outs) {
      ref.push_back(dalloc<unsigned char>(size_t(x.bytes), ref_bytes));
      CK(cudaMemcpy(ref.back(), x.p, x.bytes, cudaMemcpyDeviceToDevice));
    }
    auto bytes_differing = [&] {
      unsigned long long differing = 0;
      CK(cudaMemset(bad, 0, sizeof(*bad)));
      for (size_t i = 0; i < outs.size(); ++i)
        count_differences<<<blocks(outs[i].bytes, 256), 256>>>(static_cast<const unsigned char*>(outs[i].p), ref[i],
                                                                outs[i].bytes, bad);
      CK(cudaMemcpy(&differing, bad, sizeof(*bad), cudaMemcpyDeviceToHost));
      return differing;
    };
    r.chunked_fwd_ms = time_it([&] { fwd_chunked(false, false); });
    r.chunked_fwdbwd_ms = time_it([&] { fwd_chunked(false, false), bwd_chunked(false, false); });
    r.chunked_bytes_differing = bytes_differing();
    r.chunked_fwdbwd_kept_ms = time_it([&] { fwd_chunked(true, false), bwd_chunked(true, false); });
    r.chunked_kept_bytes_differing = bytes_differing();
    r.chunked_fwdbwd_sweep_ms = time_it([&] { fwd_chunked(true, true), bwd_chunked(true, true); });
    r.chunked_sweep_bytes_differing = bytes_differing();
    CK(cudaFree(T_kept));
    CK(cudaFree(sweep_kept));
    for (unsigned char* p : ref) CK(cudaFree(p));
    CK(cudaFree(S_at));
    CK(cudaFree(dS_at));
  }

  const double f_fwd = op.pass("fwd").flops(shape), f_bwd = op.pass("bwd").flops(shape);
  const double f_bwd_saved = op.pass("bwd saved").flops(shape), f_bwd_kept = op.pass("bwd kept T").flops(shape);
  const double f_bwd_sweep = op.pass("bwd kept sweep").flops(shape);
  r.fwd_tflops = f_fwd / (r.fwd_ms * 1e-3) / 1e12;
  r.fwdbwd_tflops = (f_fwd + f_bwd) / (r.fwdbwd_ms * 1e-3) / 1e12;
  r.fwdbwd_saved_tflops = (f_fwd + f_bwd_saved) / (r.fwdbwd_saved_ms * 1e-3) / 1e12;
  r.fwdbwd_kept_tflops = (f_fwd + f_bwd_kept) / (r.fwdbwd_kept_ms * 1e-3) / 1e12;
  r.fwdbwd_sweep_tflops = (f_fwd + f_bwd_sweep) / (r.fwdbwd_sweep_ms * 1e-3) / 1e12;
  r.workspace_gib = ws_bytes / double(1 << 30);
  r.total_gib = bytes / double(1 << 30);
  r.meminfo_gib = (free0 - free1) / double(1 << 30);
  CK(cudaFree(bad));
  return r;
}

std::string piece_name(int piece_len) { return piece_len ? std::to_string(piece_len) : "off"; }

// The sweeps a result ran: the split core's pieces, or the unsplit core's row or tile sweeps.
std::string sweep_name(const Result& r) {
  if (r.piece_len) return "split";
  return r.sweep == stateflow::GdnCudaConfig::kTileSweeps ? "tiles" : "rows";
}

std::string slab_name(const Result& r) { return r.b4_slab ? std::to_string(r.b4_slab) : "auto"; }

// The overlap as asked, its segment and streams: "def" (the lever), "off", or "32x2" (0: "a", the core's).
std::string overlap_name(const Result& r) {
  if (r.overlap == 0) return "def";
  if (r.overlap < 0) return "off";
  auto asked = [](int x) { return x ? std::to_string(x) : std::string("a"); };
  return asked(r.overlap_segment) + "x" + asked(r.overlap_streams);
}

// Splits "a,b,c" into its items.
std::vector<std::string> parse_words(const char* s) {
  std::vector<std::string> out;
  for (const char* p = s; *p;) {
    const char* end = std::strchr(p, ',');
    out.emplace_back(p, end ? end : p + std::strlen(p));
    p = end ? end + 1 : p + std::strlen(p);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t B = 1, H = 16;
  std::vector<int64_t> lens = {8192, 32768, 131072};
  int reps = 20, value_tile = 0, piece_tile = 0, sweep_warps = 0, key_split = 0;
  std::vector<int64_t> b4_slabs = {0};
  std::vector<int> sweeps = {stateflow::GdnCudaConfig::kDefaultSweep};
  std::vector<int> splits = {0};  // piece lengths; 0 = default, GdnCudaConfig::kUnsplit = off
  std::vector<int64_t> chunk_lens;
  std::vector<int> overlaps = {0};
  std::vector<int64_t> overlap_segments = {0}, overlap_streams = {0};
  const char* json = nullptr;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--batch") B = std::atoll(argv[i + 1]);
    else if (a == "--heads") H = std::atoll(argv[i + 1]);
    else if (a == "--len") lens = parse_list(argv[i + 1]);
    else if (a == "--reps") reps = std::atoi(argv[i + 1]);
    else if (a == "--value-tile") value_tile = std::atoi(argv[i + 1]);
    else if (a == "--sweep-warps") sweep_warps = std::atoi(argv[i + 1]);
    else if (a == "--sweep-key-split") key_split = std::atoi(argv[i + 1]);
    else if (a == "--sweep") {
      sweeps.clear();
      for (const std::string& item : parse_words(argv[i + 1])) {
        using Cfg = stateflow::GdnCudaConfig;
        if (item == "default") sweeps.push_back(Cfg::kDefaultSweep);
        else if (item == "rows") sweeps.push_back(Cfg::kRowSweeps);
        else if (item == "tiles") sweeps.push_back(Cfg::kTileSweeps);
        else {
          std::fprintf(stderr, "--sweep takes default, rows or tiles, got %s\n", item.c_str());
          return 2;
        }
      }
    }
    else if (a == "--piece-tile") piece_tile = std::atoi(argv[i + 1]);
    else if (a == "--b4-slab") b4_slabs = parse_list(argv[i + 1]);
    else if (a == "--split") {
      splits.clear();
      for (const char* p = argv[i + 1]; *p;) {
        const char* end = std::strchr(p, ',');
        const std::string item(p, end ? end : p + std::strlen(p));
        char* num_end = nullptr;
        const long len = std::strtol(item.c_str(), &num_end, 10);
        const bool number = !item.empty() && *num_end == '\0' && len > 0;
        splits.push_back(item == "default" ? 0 : item == "off" ? stateflow::GdnCudaConfig::kUnsplit : int(len));
        if (item != "default" && item != "off" && !number) {
          std::fprintf(stderr, "--split takes default, off or a piece length in tokens, got %s\n", item.c_str());
          return 2;
        }
        p = end ? end + 1 : p + std::strlen(p);
      }
    }
    else if (a == "--chunk-len") chunk_lens = parse_list(argv[i + 1]);
    else if (a == "--overlap") {
      overlaps.clear();
      for (const std::string& item : parse_words(argv[i + 1])) {
        if (item != "default" && item != "off" && item != "on") {
          std::fprintf(stderr, "--overlap takes default, off or on, got %s\n", item.c_str());
          return 2;
        }
        overlaps.push_back(item == "on" ? 1 : item == "off" ? -1 : 0);
      }
    }
    else if (a == "--overlap-segment") overlap_segments = parse_list(argv[i + 1]);
    else if (a == "--overlap-streams") overlap_streams = parse_list(argv[i + 1]);
    else if (a == "--json") json = argv[i + 1];
    else {
      std::fprintf(stderr, "unknown option %s (see the header of gdn_core_bench.cu)\n", argv[i]);
      return 2;
    }
  }
  for (int64_t L : chunk_lens)
    if (L < 1 || B != 1) {
      std::fprintf(stderr, "--chunk-len needs positive lengths and --batch 1 (a chunk of batch 1 is contiguous)\n");
      return 2;
    }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("GDN core (CUDA) benchmark on %s (%d SMs): bf16, batch %lld, heads %lld, dk = dv = 128, C = 64, "
              "row-sweep key split %s, warps %s, value tile %s, piece tile %s, median of %d\n",
              prop.name, prop.multiProcessorCount, (long long)B, (long long)H,
              key_split ? std::to_string(key_split).c_str() : "auto",
              sweep_warps ? std::to_string(sweep_warps).c_str() : "auto",
              value_tile ? std::to_string(value_tile).c_str() : "auto",
              piece_tile ? std::to_string(piece_tile).c_str() : "auto", reps);
  std::vector<Result> res;
  try {
    for (int64_t b4_slab : b4_slabs)
      for (int sweep : sweeps)
        for (int split : splits)
          for (int64_t T : lens)
            for (int overlap : overlaps)
              for (int64_t segment : overlap_segments)
                for (int64_t streams : overlap_streams) {
                  // segments and streams matter only when on
                  if (overlap <= 0 && (segment != overlap_segments.front() || streams != overlap_streams.front())) continue;
                  stateflow::GdnCudaConfig cfg;
                  cfg.sweep = sweep, cfg.sweep_warps = sweep_warps, cfg.sweep_key_split = key_split;
                  cfg.b4_slab = int(b4_slab);
                  cfg.overlap = overlap, cfg.overlap_segment = int(segment), cfg.overlap_streams = int(streams);
                  cfg.value_tile = value_tile, cfg.piece_tile = piece_tile, cfg.piece_len = split;
                  res.push_back(run(B, H, T, reps, cfg, 0));
                  for (int64_t L : chunk_lens) res.push_back(run(B, H, T, reps, cfg, L));
                }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gdn_core_bench: %s\n", e.what());
    return 1;
  }
  std::printf("\n%8s %6s %6s %4s %7s | %8s %7s | %8s %7s | %8s %7s | %8s %7s | %8s %7s | %17s | %23s | %17s | %5s | %11s "
              "| %6s %6s %6s | %s\n",
              "T", "sweep", "piece", "b4sl", "overlap", "fwd ms", "TFLOP/s", "f+b ms", "TFLOP/s", "f+b kT", "TFLOP/s", "f+b kS",
              "TFLOP/s", "f+b sv", "TFLOP/s", "Pre   ST    Out", "B1    B2    B3    B4", "sv B2 B3    B4", "kT B1",
              "kS B1 B3", "wsGiB", "allGiB", "memGiB", "nonfinite");
  for (const Result& r : res) {
    if (r.chunk_len) continue;
    std::printf("%8lld %6s %6s %4s %7s | %8.3f %7.1f | %8.3f %7.1f | %8.3f %7.1f | %8.3f %7.1f | %8.3f %7.1f | "
                "%5.3f %5.3f %5.3f | %5.3f %5.3f %5.3f %5.3f | %5.3f %5.3f %5.3f | %5.3f | %5.3f %5.3f | "
                "%6.2f %6.2f %6.2f | %llu\n",
                (long long)r.len, sweep_name(r).c_str(), piece_name(r.piece_len).c_str(), slab_name(r).c_str(),
                overlap_name(r).c_str(), r.fwd_ms,
                r.fwd_tflops, r.fwdbwd_ms, r.fwdbwd_tflops, r.fwdbwd_kept_ms, r.fwdbwd_kept_tflops, r.fwdbwd_sweep_ms,
                r.fwdbwd_sweep_tflops, r.fwdbwd_saved_ms, r.fwdbwd_saved_tflops, r.stage_ms[0], r.stage_ms[1],
                r.stage_ms[2], r.stage_ms[3], r.stage_ms[4], r.stage_ms[5], r.stage_ms[6], r.stage_ms[8], r.stage_ms[9],
                r.stage_ms[10], r.stage_ms[11], r.stage_ms[15], r.stage_ms[17], r.workspace_gib, r.total_gib,
                r.meminfo_gib, r.nonfinite);
  }
  std::printf("\nPer stage, unsplit one-call rows, default backward: ms, GB/s of the bytes the stage must move, "
              "tensor-core TFLOP/s\n%8s %6s %4s %7s |", "T", "sweep", "b4sl", "overlap");
  const char* stage_names[7] = {"Pre", "ST", "Out", "B1", "B2", "B3", "B4"};
  for (const char* name : stage_names) std::printf(" %20s |", name);
  std::printf("\n");
  for (const Result& r : res) {
    if (r.chunk_len || r.piece_len) continue;
    std::printf("%8lld %6s %4s %7s |", (long long)r.len, sweep_name(r).c_str(), slab_name(r).c_str(),
                overlap_name(r).c_str());
    for (int i = 0; i < 7; ++i) {
      const double s = r.stage_ms[i] * 1e-3;
      std::printf(" %6.3f %6.0f %6.1f |", r.stage_ms[i], s > 0 ? r.cost.bytes[i] / s / 1e9 : 0.0,
                  s > 0 ? r.cost.flops[i] / s / 1e12 : 0.0);
    }
    std::printf("\n");
  }
  if (!chunk_lens.empty()) {
    std::printf("\nIn chunks (state carried; backward last chunk first), against one call on the same inputs:\n");
    std::printf("%8s %6s %6s %4s %7s %8s | %8s %8s | %8s %8s | %8s %8s | %8s %8s | %6s | %s\n", "T", "sweep", "piece",
                "b4sl", "overlap", "chunk", "fwd ms", "x 1 call", "f+b ms", "x 1 call", "f+b kT", "x 1 call", "f+b kS", "x 1 call",
                "chunks", "bytes differing from one call (recomputing T / T kept / T and sweep kept)");
    const Result* whole = nullptr;
    for (const Result& r : res) {
      if (!r.chunk_len) {
        whole = &r;
        continue;
      }
      std::printf("%8lld %6s %6s %4s %7s %8lld | %8.3f %8.2f | %8.3f %8.2f | %8.3f %8.2f | %8.3f %8.2f | %6lld | "
                  "%llu / %llu / %llu\n",
                  (long long)r.len, sweep_name(r).c_str(), piece_name(r.piece_len).c_str(), slab_name(r).c_str(),
                  overlap_name(r).c_str(), (long long)r.chunk_len, r.chunked_fwd_ms, r.chunked_fwd_ms / whole->fwd_ms, r.chunked_fwdbwd_ms,
                  r.chunked_fwdbwd_ms / whole->fwdbwd_ms, r.chunked_fwdbwd_kept_ms,
                  r.chunked_fwdbwd_kept_ms / whole->fwdbwd_kept_ms, r.chunked_fwdbwd_sweep_ms,
                  r.chunked_fwdbwd_sweep_ms / whole->fwdbwd_sweep_ms,
                  (long long)((r.len + r.chunk_len - 1) / r.chunk_len), r.chunked_bytes_differing,
                  r.chunked_kept_bytes_differing, r.chunked_sweep_bytes_differing);
    }
  }
  if (json) {
    FILE* f = std::fopen(json, "w");
    if (!f) {
      std::fprintf(stderr, "cannot write %s\n", json);
      return 1;
    }
    std::fprintf(f, "{\"device\": \"%s\", \"batch\": %lld, \"heads\": %lld, \"value_tile\": %d, \"results\": [\n",
                 prop.name, (long long)B, (long long)H, value_tile);
    for (size_t i = 0; i < res.size(); ++i) {
      const Result& r = res[i];
      std::fprintf(f,
                   "  {\"len\": %lld, \"sweep\": \"%s\", \"b4_slab\": %d, \"piece_len\": %d, \"overlap\": %d, "
                   "\"overlap_segment\": %d, \"overlap_streams\": %d, \"fwd_ms\": %.4f, \"fwd_tflops\": %.2f, \"fwdbwd_ms\": %.4f, "
                   "\"fwdbwd_tflops\": %.2f, \"fwdbwd_saved_ms\": %.4f, \"fwdbwd_saved_tflops\": %.2f, \"fwdbwd_kept_T_ms\": %.4f, \"fwdbwd_kept_sweep_ms\": %.4f, "
                   "\"stage_ms\": {\"pre\": %.4f, \"st\": %.4f, \"out\": %.4f, \"b1\": %.4f, \"b2\": %.4f, "
                   "\"b3\": %.4f, \"b4\": %.4f, \"saved_b2\": %.4f, \"saved_b3\": %.4f, \"saved_b4\": %.4f, \"kept_T_b1\": %.4f, "
                   "\"kept_sweep_b1\": %.4f, \"kept_sweep_b3\": %.4f}, "
                   "\"workspace_gib\": %.3f, \"allocated_gib\": %.3f, \"nonfinite\": %llu, \"chunk_len\": %lld, "
                   "\"chunked_fwd_ms\": %.4f, \"chunked_fwdbwd_ms\": %.4f, \"chunked_bytes_differing\": %llu, "
                   "\"chunked_fwdbwd_kept_T_ms\": %.4f, \"chunked_kept_T_bytes_differing\": %llu, "
                   "\"chunked_fwdbwd_kept_sweep_ms\": %.4f, \"chunked_kept_sweep_bytes_differing\": %llu}%s\n",
                   (long long)r.len, sweep_name(r).c_str(), r.b4_slab, r.piece_len, r.overlap, r.overlap_segment, r.overlap_streams, r.fwd_ms, r.fwd_tflops, r.fwdbwd_ms, r.fwdbwd_tflops, r.fwdbwd_saved_ms,
                   r.fwdbwd_saved_tflops, r.fwdbwd_kept_ms, r.fwdbwd_sweep_ms, r.stage_ms[0], r.stage_ms[1],
                   r.stage_ms[2], r.stage_ms[3], r.stage_ms[4], r.stage_ms[5], r.stage_ms[6], r.stage_ms[8],
                   r.stage_ms[9], r.stage_ms[10], r.stage_ms[11], r.stage_ms[15], r.stage_ms[17], r.workspace_gib,
                   r.total_gib, r.nonfinite, (long long)r.chunk_len, r.chunked_fwd_ms, r.chunked_fwdbwd_ms,
                   r.chunked_bytes_differing, r.chunked_fwdbwd_kept_ms, r.chunked_kept_bytes_differing,
                   r.chunked_fwdbwd_sweep_ms, r.chunked_sweep_bytes_differing, i + 1 < res.size() ? "," : "");
    }
    std::fprintf(f, "]}\n");
    std::fclose(f);
  }
  return 0;
}
