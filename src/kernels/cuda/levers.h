// Benchmark switches for the chunk-tax levers (docs/benchmarks.md, "The chunk tax"):
// STATEFLOW_LEVERS_OFF=conv_tiles,norm_rows,gemm_rows,reduce_ahead,embed_ahead,side_stream,conv_group,
//                      side_defer,out_gate_by_core,conv_walk,head_blocks,residual_fused,keep_t,gate_steps,
//                      conv_narrow,reduce_deep,norm_staged,sweep_quarters,reduce_group,sweep_copy_warp,
//                      tile_copies,graphs,b4_ring,pre_mma,fused_proj,fused_mlp,sweep_multicast,
//                      b4_ring_early,core_overlap,gemm_short,l2norm_pair,add_vectors,dw_beside,sweep_deep,
//                      sweep_copy_lines,b2_lean,pre_late_v,b4_lean,gates_beside,residual_epilogue,
//                      graph_priority
// runs the named levers the way the code ran before them, so that one build measures each on and
// off in one session.
//   conv_tiles    short conv: 64-row tiles in both passes (instead of shorter forward tiles for
//                 short chunks, and 16-row backward tiles summed per 64-token block)
//   norm_rows     RMS norm backward: 16 rows per lane team (instead of 4)
//   gemm_rows     cuBLASLt: the pinned algorithm chosen for 16K rows (instead of 2K)
//   reduce_ahead  token-block reductions: each segment's load waited for (instead of 8 at once)
//   embed_ahead   embedding backward: each row of a token's run waited for (instead of 8 at once)
//   side_stream   every kernel of a layer on the main stream (instead of weight gradients, the
//                 GDN's gate projections and x W3 on a side stream: kernels/cuda/side_stream_cuda.h)
//   conv_group    short conv: one launch per conv (instead of the GDN's q, k, v convs in one)
//   side_defer    side-stream weight gradients joined at the end of each layer's backward (instead
//                 of running on beside the next layer's, inside the stage executor's unit)
//   out_gate_by_core  GDN forward: the output gate's projection beside the q, k, v projections
//                 (instead of beside the core)
//   conv_walk     short conv backward: 16-row tiles at every length (instead of a whole 64-token
//                 block per thread where the chunk gives enough threads; same bits)
//   head_blocks   LM head: logits in blocks of ~256 MiB (instead of ~512 MiB: 2048 tokens at a
//                 32K vocabulary, so its weight gradient's fp32 sum is read and written half as often)
//   residual_fused  pre-norm residual backward: dx += dy as a kernel of its own (instead of added
//                 by the RMS-norm backward as it stores dx; same bits)
//   keep_t        GDN core: the backward recomputes T = (I + A)^-1 (instead of the layer keeping
//                 it from the forward, 128 bytes per token and head of activation memory; same bits)
//   gate_steps    GDN gates backward: dA_log and ddt_bias walk every 64-token block's partial in
//                 one chain (instead of summing each 2048-token step's blocks in parallel first;
//                 bitwise at 2048-token cuts instead of 64: mixers/gdn/gdn_gates_cuda.h)
//   conv_narrow   short conv: a thread works on 8 channels (instead of 2: 4x the threads at a
//                 quarter of the registers; same bits)
//   reduce_deep   token-block reductions (and the GDN gates' step sums): 8 partials loaded ahead
//                 of their additions (instead of 32: a chain costs a quarter of the memory
//                 latencies; same sums)
//   norm_staged   RMS-norm backward with the fused residual: the residual loaded vector by vector
//                 between the stores of dx (instead of with the row's first pass; same arithmetic)
//   sweep_quarters  GDN core: row sweeps with 2 warps per 16 state rows (instead of 4, each a
//                 quarter of the key columns: mixers/gdn/gdn_core_quarter_sweeps.cuh; another
//                 summation order, exact and chunk-invariant either way)
//   reduce_group  token-block reductions of several gradients (the GDN's q, k, v conv weights,
//                 Mamba-3's output-gate mixes) one launch each (instead of one launch for all;
//                 same sums)
//   sweep_copy_warp  GDN core: the quarter sweeps' warps issue their own tile copies (instead of
//                 a fifth warp per 4-warp block issuing them; same bits)
//   tile_copies   GDN core Pre, B2, Out, B4: tiles copied to shared memory by the generic loop
//                 (instead of each thread's offsets computed once, cuda::TileCopy: B4's SASS
//                 5440 -> 3976 instructions; same bits; GdnCudaConfig::tile_copies)
//   graphs        stage executor: every kernel of a unit's blocks launched on its own (instead of
//                 each run of consecutive blocks recorded as one CUDA graph and launched as one:
//                 kernels/cuda/device_graph_cuda.h; the same kernels, so the same bits; default
//                 since its H200 run in the seventh session: gdn-1.3b 32K, N = 32 0.847 -> 0.823 s)
//   b4_ring       GDN core B4: the state slabs through a two-slot ring, dV_new loaded at the start
//                 (instead of four slots, three slabs in flight, dV_new loaded for the second pass:
//                 mixers/gdn/gdn_core_b4_ring.cuh; GdnCudaConfig::b4_kernel; same bits)
//   pre_mma       GDN core Pre: T = (I + A)^-1 by fp32 block products in shared memory (instead of
//                 on tensor cores, each fp32 operand split into two bf16 halves:
//                 mixers/gdn/gdn_core_pre.cuh; T within ~2^-16 relative before its bf16 rounding;
//                 GdnCudaConfig::pre)
//   fused_proj    GDN: one GEMM per input projection (instead of q, k, v and the output gate as
//                 one GEMM of x against their bf16 weights side by side, and their input gradient
//                 as one GEMM over their output gradients side by side: model/param.h's shared
//                 bf16 copies; another rounding of dx, exact and chunk-invariant either way;
//                 default since its H200 run in the sixth session)
//   fused_mlp     MLP: x W1 and x W3 as two GEMMs, x W3 on the side stream (instead of one GEMM
//                 against W1 and W3 side by side, and dx as one GEMM over da and db side by side;
//                 as fused_proj; untried: its one GEMM is slower than the two at 32K rows)
//   sweep_multicast  GDN core: each quarter-sweep block loads the W, K (Q) tiles from L2 itself
//                 (instead of the copy warps of a head's 8 blocks, one thread-block cluster,
//                 each fetching 8 rows of them multicast to all 8: mixers/gdn/
//                 gdn_core_quarter_sweeps.cuh; GdnCudaConfig::sweep_multicast; same bits; on the H200
//                 bitwise but 3x slower, ST 0.54 -> 1.62 ms at 32K: opt-in, docs/benchmarks.md)
//   b4_ring_early  GDN core B4's deep ring: the second pass's first slabs and v issued after the Out
//                 terms' product (instead of as soon as the first pass ends, dPG and T placed where
//                 dO was; GdnCudaConfig::kB4EarlySlabs; same bits)
//   core_overlap  GDN core backward from a kept forward sweep (gdn.keep_sweep): B3 then B4 (instead
//                 of B4 beside B3, each launch for the sub-chunks B3 has finished, behind GPU-side
//                 stream waits: mixers/gdn/gdn_core_overlap_cuda.h; GdnCudaConfig::overlap; same
//                 kernels, same bits; default since its H200 runs in the seventh session)
//   gemm_short    row-wise GEMMs: every row on the algorithm pinned at 2048 rows (instead of the
//                 tails of a sequence past its last multiple of 2048 tokens, where short, on a second
//                 one pinned at 1024 rows, deterministic split-K allowed: kernels/cuda/gemm_cuda.h;
//                 bitwise at 2048-token cuts either way, other rounding elsewhere; default since its
//                 H200 run in the seventh session)
//   l2norm_pair   GDN: the L2 norms of q and of k one launch each, both ways (instead of both in
//                 one launch, a grid row each; same bits)
//   add_vectors   residual adds (add_inplace_cuda): one value a thread (instead of 8, with
//                 16-byte loads and stores, where both arrays are 16-byte aligned; same bits)
//   dw_beside     the GDN's gated-norm and conv dw reductions and the pre-norm residual's norm dw
//                 reduction on the main stream in place (instead of on the side stream beside the
//                 layer's other work, like the weight gradients: at 1-2K-token chunks two launches
//                 of a few memory latencies each that the main stream waited for; same kernels,
//                 same bits; l2norm_pair, add_vectors and dw_beside default since their H200 run
//                 in the seventh session)
//   sweep_deep    GDN core ST (quarter sweeps, copy warp): three sub-chunks of W, K and U in flight
//                 (instead of four, 167 KiB of shared memory instead of 130; GdnCudaConfig::
//                 sweep_stages; same bits)
//   sweep_copy_lines  GDN core ST and B3 (quarter sweeps, copy warp): every 16-byte chunk of a tile
//                 copied with its own predicated address (instead of tiles whose rows are all valid
//                 copied by whole 128-byte lines, one address per row a lane copies: 548 -> 218
//                 copy-warp instructions per ST step; GdnCudaConfig::sweep_copy_lines; same bits;
//                 sweep_deep and sweep_copy_lines default since their H200 run in the eighth session:
//                 ST 0.539 -> 0.455 ms at 32K)
//   b2_lean       GDN core B2: Q, K, dO and P each in shared memory, three blocks per SM (instead of
//                 P where Q was, four blocks, dO landing under Q K^T, the causal mask's zero blocks
//                 skipped, 16-byte stores: mixers/gdn/gdn_core_b2.cuh; GdnCudaConfig::b2; same bits;
//                 default since its H200 run in the eighth session: 0.167 -> 0.143 ms at 32K)
//   pre_late_v    GDN core Pre on tensor cores: K and V loaded together at the start, three blocks
//                 per SM (instead of V loaded after the inversion into its buffers, four blocks:
//                 mixers/gdn/gdn_core_pre.cuh; GdnCudaConfig::kPreLateV; same bits; default since
//                 its H200 run in the eighth session: Pre 0.259 -> 0.246 ms at 32K)
//   b4_lean       GDN core B4's deep ring with early slabs: its epilogues as they were (instead of the
//                 row dots reading their tiles as ldmatrix fragments, the causal masks as selects,
//                 warps whose tile the mask empties skipping their exps, bf16 widened by shifts, q, k
//                 and beta loaded after the first slabs: GdnCudaConfig::kB4Lean,
//                 mixers/gdn/gdn_core_b4_ring.cuh; same bits; default since its H200 run in the
//                 eighth session: B4 at 32K 0.99 -> 0.93 ms)
//   gates_beside  GDN backward: the gates kernel (da, db, dA_log, ddt_bias) on the main stream
//                 between the core and the L2 norms (instead of on the side stream beside the L2
//                 norms, convs and q, k, v's input gradient, the main stream waiting for da, db only
//                 at the gate projections' input gradient: SideWork::mark; same kernels, same bits)
//   residual_epilogue  pre-norm residual forward: y = x + inner(h) added by a kernel of its own after
//                 the inner layer (instead of in the inner layer's last GEMM, the GDN's output
//                 projection or the MLP's down projection, as cuBLASLt's beta C with C = x: one launch
//                 fewer per block and chunk, y rounded to bf16 once instead of twice; another
//                 rounding, so within twice the old path's error; row-wise, so chunk-invariant;
//                 gates_beside and residual_epilogue default since their H200 runs in the eighth
//                 session: gdn-1.3b 32K, N = 16 0.6687 -> 0.6573 s)
//   graph_priority  CUDA graphs: every kernel at its launch stream's priority (instead of the main
//                 stream's recorded kernels at the device's greatest stream priority and the side
//                 stream's at the least, so that where both wait for SMs the main stream's blocks
//                 start first; kernels/cuda/device_graph_cuda.cu; scheduling only, same bits;
//                 untried: on the H200 no gain measured, docs/benchmarks.md)
// Results stay exact and chunk-invariant either way (at the cuts each setting documents).
//
// Untried levers (kUntriedLevers): a new path built and compiled while no GPU was lent has not
// run on one (or has not yet shown a gain worth the default), so it stays off -- the code runs the way it did before it -- unless
// STATEFLOW_LEVERS_ON names it. tools/gpu-check.sh runs the CUDA tests with every untried lever on;
// once they pass on a GPU and a benchmark shows the gain, the lever leaves that list and is on by
// default like the others (STATEFLOW_LEVERS_OFF then turns it off).
#pragma once
#include <cstdlib>
#include <string>

#include "core/error.h"

namespace stateflow {

// Every lever's name, in the order the comment above lists them.
inline const char* const kLeverNames[] = {"conv_tiles",  "norm_rows",   "gemm_rows",
                                           "reduce_ahead", "embed_ahead", "side_stream",
                                           "conv_group",  "side_defer",  "out_gate_by_core",
                                           "conv_walk",   "head_blocks", "residual_fused",
                                           "keep_t",      "gate_steps",  "conv_narrow",
                                           "reduce_deep", "norm_staged", "sweep_quarters",
                                           "reduce_group", "sweep_copy_warp", "tile_copies", "graphs",
                                           "b4_ring",     "pre_mma",     "fused_proj",
                                           "fused_mlp",   "sweep_multicast", "b4_ring_early",
                                           "core_overlap", "gemm_short", "l2norm_pair", "add_vectors",
                                           "dw_beside", "sweep_deep", "sweep_copy_lines", "b2_lean", "pre_late_v",
                                           "b4_lean", "gates_beside", "residual_epilogue", "graph_priority"};

// Levers not yet made defaults (not yet run on a GPU, or, like fused_mlp, sweep_multicast and
// graph_priority, run and passing but not worth the default): off unless STATEFLOW_LEVERS_ON names them (see above).
// One line: tools/gpu-check.sh and bench/chunk_tax.sh read the names from it.
inline const char* const kUntriedLevers[] = {"fused_mlp", "sweep_multicast", "graph_priority"};

// The levers a STATEFLOW_LEVERS_OFF (or `variable`) value names, as ",a,b,"; throws Error on a
// name that is no lever (a typo would otherwise measure a lever "off" that ran on).
inline std::string parse_levers_off(const std::string& value, const char* variable = "STATEFLOW_LEVERS_OFF") {
  std::string known = ",", listed;
  for (const char* lever : kLeverNames) {
    known += std::string(lever) + ",";
    listed += (listed.empty() ? "" : ", ") + std::string(lever);
  }
  std::string names = ",";
  for (size_t at = 0; at <= value.size();) {
    size_t end = value.find(',', at);
    if (end == std::string::npos) end = value.size();
    const std::string name = value.substr(at, end - at);
    SF_CHECK(name.empty() || known.find("," + name + ",") != std::string::npos, variable, " names '", name,
             "', which is no lever; the levers are ", listed);
    if (!name.empty()) names += name + ",";
    at = end + 1;
  }
  return names;
}

inline bool lever_untried(const std::string& name) {
  for (const char* lever : kUntriedLevers)
    if (name == lever) return true;
  return false;
}

// Whether a lever runs the old way: an untried one unless STATEFLOW_LEVERS_ON names it, any other
// when STATEFLOW_LEVERS_OFF names it.
inline bool lever_off(const std::string& name) {
  static const std::string off = [] {
    const char* v = std::getenv("STATEFLOW_LEVERS_OFF");
    return parse_levers_off(v ? v : "");
  }();
  static const std::string on = [] {
    const char* v = std::getenv("STATEFLOW_LEVERS_ON");
    return parse_levers_off(v ? v : "", "STATEFLOW_LEVERS_ON");
  }();
  const std::string key = "," + name + ",";
  if (lever_untried(name)) return on.find(key) == std::string::npos || off.find(key) != std::string::npos;
  return off.find(key) != std::string::npos;
}

}  // namespace stateflow
