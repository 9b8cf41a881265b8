// Gated DeltaNet chunk core on NVIDIA GPUs (Hopper first): the chunkwise WY algorithm of
// MATH.md sections 3-4 with the semantics and layouts of the CPU API (mixers/gdn/gdn_core.h),
// bf16 storage for the per-token vectors and fp32 for everything else.
//
//   q, k, dq, dk      bf16 [batch, len, heads, dk]
//   v, o, dO, dv      bf16 [batch, len, heads, dv]
//   beta, g, dbeta, dg fp32 [batch, len, heads]
//   S_in, S_out, dS_out, dS_in  fp32 [batch, heads, dv, dk]   (value-major)
// S_in == nullptr means a zero state, dS_out == nullptr a zero gradient; S_out may be nullptr
// when the caller does not need it. Outputs are overwritten.
//
// Supported: dk = dv = 128, sub-chunk size (GdnDims::block) C = 64, any len >= 1.
// All matrix products run on tensor cores with bf16 operands and fp32 accumulation; the
// running state and its gradient stay fp32 in registers across the whole sequence. No
// floating-point atomics: results are bitwise repeatable, and splitting a sequence at a
// multiple of C (passing S_out -> S_in and dS_in -> dS_out unrounded) is bitwise neutral.
//
// Stages (one kernel each):
//   forward:  Pre (parallel over sub-chunks: G, T = (I+A)^-1, W, U)
//             ST  (sequential over sub-chunks, parallel over batch x heads x dv row tiles;
//                  GdnCudaConfig::sweep picks row sweeps, the default, or tile sweeps)
//             Out (parallel over sub-chunks)
//   backward: B1  Pre again (skipped when saved_forward; with kept_T only G, W and U, formed
//                 from the forward's T: no K K^T product, no inversion)
//             B2  dV_new_local = P^T dO (parallel)
//             B3  the reverse dS sweep (sequential like ST); when nothing was kept the forward
//                 sweep (B1') runs again beside it (row sweeps: in blocks of its own; tile
//                 sweeps: a second warpgroup of each block)
//             B4  all remaining gradients (parallel; the state and its gradient stream through
//                 shared memory in slabs of value rows, GdnCudaConfig::b4_slab)
// Split core (GdnCudaConfig::piece_len or STATEFLOW_GDN_PIECE_LEN; off by default): ST and B3
// cut each sequence into pieces of piece_len tokens swept in parallel from a zero state, plus each
// piece's state transition (fp32, exact: no truncation), folded in piece order in fp32; then
// each piece is swept again from its true entering state (three sweeps' work spread over
// pieces instead of one sweep in sequence; the backward reuses the forward's transitions,
// transposed). S_out and dS_in always come from the fold, so a split of the sequence at a
// multiple of piece_len (not merely of C) is bitwise neutral. Without saved_forward the
// backward recomputes the forward's piece sweeps before the reverse ones.
// Forward leaves in the workspace, per sub-chunk: G (fp32), T, W, U, V_new and the entering
// state (bf16). Backward either recomputes all of it (default: the workspace may have been
// reused in between; only the inputs and S_in are needed, MATH.md 4.1) or, with
// GdnCudaConfig::saved_forward, reads it back and skips B1 and B1'. A caller can also keep the
// forward sweep's inputs G, W and results V_new and entering states (GdnCudaConfig::sweep_buffer
// and kept_sweep, gdn_cuda_kept_sweep_bytes(): 1028 bytes per token and head), so B3 runs without
// B1', and with T kept too B1 is skipped. In between, a caller can keep
// only T (GdnCudaConfig::T_buffer and kept_T, gdn_cuda_kept_T_bytes(): 2 C = 128 bytes per token
// and head), the one part of Pre that costs more to recompute than to keep (MATH.md 4.1). T is
// rounded to bf16 before W and U are formed from it, so W and U formed from a kept T are
// bitwise those of the forward (and the backward differentiates the T the forward used).
// Workspace: gdn_cuda_workspace_bytes() bytes of global memory,
// 4 dk dv / C + 2 dk + 6 dv + 2 C + 4 bytes per token and head (2180 at dk = dv = 128:
// 1.06 GiB for 32K tokens x 16 heads), plus 3 x 64 KiB per piece and head when split
// (384 bytes per token and head at piece_len 512), plus 8 bytes per sub-chunk for the overlap's
// counters (GdnCudaConfig::overlap).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "mixers/gdn/gdn_core.h"

namespace stateflow {

struct GdnCudaConfig {
  // The unsplit core's sequential sweeps (ST, B1', B3). kRowSweeps: each warp keeps 16 rows
  // of the state (or half their columns) in registers for the whole sequence and a step needs
  // one block barrier;
  // kTileSweeps: the earlier sweeps (8 warps share a 16..64-row tile, three barriers a step),
  // kept for comparison. Both give the same results up to rounding. kDefaultSweep takes
  // STATEFLOW_GDN_SWEEP ("rows" or "tiles"; rows when unset).
  enum Sweep { kDefaultSweep = 0, kRowSweeps = 1, kTileSweeps = 2 };
  int sweep = kDefaultSweep;
  // Row sweeps: warps per 16 state rows, each keeping DK / sweep_key_split key columns (1, 2 or
  // 4; 0 = 4, the quarter sweeps, or 2 with the lever sweep_quarters off), and warps per block
  // (2, 4 or 8, at least the key split; 0 = one row group, two for a backward that recomputes
  // the forward with split keys); a block owns consecutive rows of one (batch, head) and loads
  // its streamed tiles once for all its warps.
  int sweep_key_split = 0;
  int sweep_warps = 0;
  // Quarter sweeps with one row group per block (4 warps): 1 = a fifth warp issues the tile
  // copies, -1 = the sweep warps do; 0 = the lever sweep_copy_warp (on unless
  // STATEFLOW_LEVERS_OFF names it). Same results, bitwise.
  int sweep_copy_warp = 0;
  // With the copy warp: 4 or 8 = the blocks of a (batch, head) run as clusters of that many and
  // the copy warp multicasts the tiles they all read (W, K; K, W, Q), each block fetching its
  // share of the rows; -1 = every block loads them itself; 0 = the lever sweep_multicast
  // (untried: off unless STATEFLOW_LEVERS_ON names it; 8 when on). Same results, bitwise.
  int sweep_multicast = 0;
  // ST's quarter sweeps with one row group a block and per-block copies (by the copy warp or not):
  // sub-chunks of W, K and U in flight (3 or 4; 0 = the lever sweep_deep: 4 unless
  // STATEFLOW_LEVERS_OFF names it). Same results, bitwise.
  int sweep_stages = 0;
  // The quarter sweeps' per-block copies with one row group a block (no multicast), by the copy
  // warp or shared by the sweep warps: 1 = whole tiles by lines, each lane one address per row it
  // copies (16-byte chunks of whole 128-byte lines per instruction);
  // -1 = every chunk by its own predicated address (TileCopy); 0 = the lever sweep_copy_lines
  // (1 unless STATEFLOW_LEVERS_OFF names it). Tiles with rows past the sequence's end
  // (a short last sub-chunk, the pipeline's lead-in and tail) take the predicated copies either
  // way. Same bytes in shared memory, so the same results, bitwise.
  int sweep_copy_lines = 0;
  // Tile sweeps: width BV of the dv tile one forward ST block owns (16, 32 or 64); 0 picks the
  // widest tile that still gives at least one block per SM. Their backward uses BV = 16.
  int value_tile = 0;
  // Backward stage B4: value rows of the state and of its gradient streamed through shared
  // memory at a time (16, 32 or 64; 0 = 16, which lets two blocks share an SM; 64 and 32 hold
  // one block per SM, as the earlier kernel that kept both whole did). Same results, bitwise.
  int b4_slab = 0;
  // Backward stage B4's tensor-core products. kMmaSync: warp-level mma.sync on ldmatrix
  // fragments; kWgmma: each warpgroup's products as wgmma reading both operands from shared
  // memory (sm_90a; gdn_cuda_wgmma_available()). The same products in the same order of 16-wide
  // K steps: bitwise the same results on the H200 (tested). Measured slower there (1.52 vs 1.19 ms
  // at 32K, docs/benchmarks.md), so not the default. kDefaultMma takes STATEFLOW_GDN_B4
  // ("mma_sync", also when unset, or "wgmma").
  enum B4Mma { kDefaultMma = 0, kMmaSync = 1, kWgmma = 2 };
  int b4_mma = kDefaultMma;
  // Backward stage B4's kernel. kB4TwoSlots: the state slabs through a two-slot ring (every
  // b4_slab and b4_mma); kB4DeepRing: the same gradients, bitwise, with four slots of 16 rows
  // (b4_slab 16: three slabs in flight behind the one used; 32: two behind two) and dV_new loaded
  // only when the second pass needs it; kB4EarlySlabs: the deep ring with the second pass's first
  // slabs and v issued as soon as the first pass ends (dPG and T where dO was), same bits. The deep
  // rings run mma.sync, b4_slab 0, 16 or 32 and copies by plans only (anything else is an error).
  // kB4Lean: the early slabs with leaner epilogues (row dots on ldmatrix fragments, the causal
  // masks as selects, q, k and beta loaded after the first slabs), same bits. kDefaultB4Kernel: the
  // deep ring with its early slabs and lean epilogues where the config allows it, unless
  // STATEFLOW_LEVERS_OFF names the lever b4_ring (two slots), b4_ring_early (no early slabs) or
  // b4_lean (the early slabs' epilogues). Measured on the H200 (docs/benchmarks.md, "B4 with a deep
  // ring", "B4's lean epilogues"): 1.19 -> 0.98 ms at 32K x 16 heads with 16-row steps (1.07 with 32),
  // 0.96 with the early slabs, 0.93 lean (0.99 for the early slabs in that call).
  enum B4Kernel { kDefaultB4Kernel = 0, kB4TwoSlots = 1, kB4DeepRing = 2, kB4EarlySlabs = 3, kB4Lean = 4 };
  int b4_kernel = kDefaultB4Kernel;
  // How Pre, B2, Out and B4 copy their tiles to shared memory: kCopyPlans, each thread through
  // offsets computed once (cuda::TileCopy); kCopyLoops, the generic loop (the earlier code);
  // kDefaultCopies, plans unless STATEFLOW_LEVERS_OFF names the lever tile_copies
  // (kernels/cuda/levers.h). The same bytes either way, so the same results, bitwise.
  enum TileCopies { kDefaultCopies = 0, kCopyLoops = 1, kCopyPlans = 2 };
  int tile_copies = kDefaultCopies;
  // How Pre (and B1 when T was not kept) inverts I + A: kPreScalar, fp32 block products in shared
  // memory (pre_kernel); kPreMma, on tensor cores with each fp32 operand split into two bf16
  // halves (mixers/gdn/gdn_core_pre.cuh: T within ~2^-16 relative of the scalar one before both
  // round it to bf16); kDefaultPre, the lever pre_mma (tensor cores unless STATEFLOW_LEVERS_OFF
  // names it; measured 0.349 -> 0.268 ms at 32K x 16 heads on the H200). W and U from a given T are
  // the same bits either way, so a T kept by one serves the other's backward. kPreLateV: kPreMma's
  // arithmetic with V loaded only once the inversion is done, into its buffers (50 KiB of shared
  // memory instead of 69: four blocks per SM; tile copies by plans only); the same bits as kPreMma.
  // kDefaultPre picks it unless STATEFLOW_LEVERS_OFF names the lever pre_late_v or copies are by
  // loops (measured 0.259 -> 0.246 ms at 32K x 16 heads on the H200).
  enum Pre { kDefaultPre = 0, kPreScalar = 1, kPreMma = 2, kPreLateV = 3 };
  int pre = kDefaultPre;
  // Backward stage B2's kernel: kB2Plain, Q, K, dO and P each in shared memory (60 KiB, three
  // blocks per SM); kB2Lean, P where Q was, dO landing under Q K^T, the causal mask's zero blocks
  // skipped, 16-byte stores (51 KiB, four blocks per SM: mixers/gdn/gdn_core_b2.cuh; tile copies
  // by plans only); kDefaultB2, the lever b2_lean (kB2Lean unless STATEFLOW_LEVERS_OFF names it, or
  // copies are by loops; measured 0.167 -> 0.143 ms at 32K x 16 heads on the H200). Same results,
  // bitwise.
  enum B2 { kDefaultB2 = 0, kB2Plain = 1, kB2Lean = 2 };
  int b2 = kDefaultB2;
  // Backward only: the workspace still holds what gdn_chunk_forward_cuda wrote for these same
  // inputs and S_in, so B1 and the forward-sweep recompute are skipped. Same results, bitwise.
  bool saved_forward = false;
  // Where T = (I + A)^-1 of every sub-chunk lives, bf16 [batch][heads][sub-chunks][C][C]
  // (gdn_cuda_kept_T_bytes()): nullptr = in the workspace. A caller that keeps T between the
  // forward and the backward points both calls at the same buffer.
  __nv_bfloat16* T_buffer = nullptr;
  // Backward only: T_buffer (or the workspace) still holds the T the forward wrote for these
  // same inputs, so B1 forms G, W and U from it instead of recomputing it. Same results, bitwise.
  bool kept_T = false;
  // Where the forward sweep's per-sub-chunk inputs and results that the backward reads live: G
  // (fp32), W, V_new and the state entering each sub-chunk (bf16; gdn_cuda_kept_sweep_bytes():
  // 1028 bytes per token and head): nullptr = in the workspace; else in this buffer, and the
  // workspace has no room for them (gdn_cuda_workspace_bytes(d, cfg) is smaller by that much). A
  // caller that keeps them between the forward and the backward points both calls at the same buffer.
  void* sweep_buffer = nullptr;
  // Backward only: sweep_buffer (or the workspace) still holds what the forward wrote there for
  // these same inputs and S_in, so B3 runs without the forward sweep beside it, and with kept_T
  // too B1 is skipped (the backward is then the saved_forward one). The unsplit core only: the
  // split core recomputes its pieces' transitions and forward piece sweeps (and B1 for their U).
  // Same results, bitwise.
  bool kept_sweep = false;
  // Split core: tokens per piece, a multiple of 64; 0 takes gdn_cuda_default_piece_len();
  // kUnsplit runs the sequential sweeps. Splits of a sequence are bitwise neutral at multiples
  // of the piece length (of 64 when unsplit), so keep it fixed across a model's calls.
  static constexpr int kUnsplit = -1;
  int piece_len = 0;
  // Split core: rows per block of the piece sweeps (32, 64 or 128; 0 = 64). The reverse sweeps
  // use at most 64.
  int piece_tile = 0;
  // Backward: B3 overlapped with B4 (docs/design.md "The GDN core's overlap"): B4 for the sub-chunks
  // B3's sweeps have finished runs beside them, on streams of the calling thread, each launch queued
  // behind GPU-side waits (no SM spins) on counters the sweep blocks bump per segment. Only the
  // schedule changes: the same kernels on the same inputs, so the same results, bitwise. 1 = on,
  // -1 = off, 0 = the lever core_overlap: on for the backward that reads a kept forward sweep
  // (kept_sweep, saved_forward), where the H200 measured it faster, unless STATEFLOW_LEVERS_OFF
  // names it; off where B3 re-runs the forward sweep (measured no faster). Needs
  // the unsplit quarter sweeps (1 with other sweeps is an error; the lever skips them) and a call
  // of at least two segments; runs the stages in sequence under CUDA graph capture and where the
  // driver has no stream waits (a one-line notice). The forward runs in sequence either way (Out
  // beside ST measured slower: the sweep slows beside it).
  int overlap = 0;
  // Sub-chunks per overlap segment (>= 1): how often a sweep block reports progress and how many
  // sub-chunks one B4 launch takes; calls shorter than two segments run in sequence. 0 =
  // gdn_cuda_default_overlap_segment(). 64 (4096 tokens): at 32K x 16 heads on the H200 as fast as
  // 32 and faster than 8 or 16 (docs/benchmarks.md); the overlap is then off for calls under 8192
  // tokens, where it did not pay (2048-token chunks with segments of 4 or 8 were slower).
  static constexpr int kDefaultOverlapSegment = 64;
  int overlap_segment = 0;
  // Streams the B4 launches take turns on (1 to 4), so that a launch need not wait for the one
  // before it to end; 0 = kDefaultOverlapStreams.
  static constexpr int kDefaultOverlapStreams = 2;
  int overlap_streams = 0;
  // When non-null: synchronises after each stage and writes its time in ms here (forward:
  // 3 entries Pre, ST, Out; backward: 4 entries B1 (0 when skipped), B2, B3, B4). For benchmarks.
  // Overlapped, B3 includes B4 (which then reads 0).
  float* stage_ms = nullptr;
};

// Bytes of device workspace both calls need for dims d (the backward need; forward uses part).
size_t gdn_cuda_workspace_bytes(const GdnDims& d, const GdnCudaConfig& cfg = {});

// Whether this build and the current device can run the wgmma kernels (GdnCudaConfig::kWgmma): a
// compute capability 9.x GPU and sm_90a machine code in the build.
bool gdn_cuda_wgmma_available();
// What b4_mma = kDefaultMma means: STATEFLOW_GDN_B4, "mma_sync" (kMmaSync, also when unset) or
// "wgmma" (kWgmma); anything else is an error naming it.
int gdn_cuda_default_b4_mma();

// What piece_len = 0 means: the environment variable STATEFLOW_GDN_PIECE_LEN, "off" (kUnsplit,
// also when unset) or tokens per piece dividing 2048 (anything else is an error naming it).
int gdn_cuda_default_piece_len();
// What overlap_segment = 0 means: STATEFLOW_GDN_OVERLAP_SEGMENT (sub-chunks >= 1), else
// GdnCudaConfig::kDefaultOverlapSegment; anything else is an error naming it.
int gdn_cuda_default_overlap_segment();
// What sweep = kDefaultSweep means: STATEFLOW_GDN_SWEEP, "rows" (kRowSweeps, also when unset) or
// "tiles" (kTileSweeps); anything else is an error naming it.
int gdn_cuda_default_sweep();

// What each stage of the unsplit core moves and computes, for benchmarks (gdn_core_bench's per-stage
// table), in the order of GdnCudaConfig::stage_ms: forward Pre, ST, Out, backward B1, B2, B3, B4
// (B1 = Pre; B3 with the forward sweep beside it unless saved_forward). bytes: device memory the
// kernels read and write at least once (tiles re-read by other blocks or passes come from L2 and
// are not counted); flops: the tensor-core products they issue (short last sub-chunks padded to 64).
struct GdnStageCost {
  double bytes[7], flops[7];
};
GdnStageCost gdn_cuda_stage_cost(const GdnDims& d, bool saved_forward);

// Bytes of GdnCudaConfig::T_buffer for dims d: 2 C^2 per sub-chunk, head and sequence.
size_t gdn_cuda_kept_T_bytes(const GdnDims& d);
// Bytes of GdnCudaConfig::sweep_buffer for dims d, per head and sequence: G (4 per token), W (2 dk
// per token), V_new (2 dv per token) and the entering state (2 dv dk per sub-chunk): 1028 per token
// and head at dk = dv = 128.
size_t gdn_cuda_kept_sweep_bytes(const GdnDims& d);

// The piece length a call with these dims and config uses (0 when not split).
int gdn_cuda_piece_len(const GdnDims& d, const GdnCudaConfig& cfg = {});

// Whether a backward call with these dims and config, on `stream` now, overlaps B3 with B4
// (GdnCudaConfig::overlap). Refuses a bad overlap setting.
bool gdn_cuda_overlaps_backward(const GdnDims& d, const GdnCudaConfig& cfg = {}, cudaStream_t stream = nullptr);

void gdn_chunk_forward_cuda(const GdnDims& d, const __nv_bfloat16* q, const __nv_bfloat16* k,
                            const __nv_bfloat16* v, const float* beta, const float* g, const float* S_in,
                            __nv_bfloat16* o, float* S_out, void* workspace, cudaStream_t stream,
                            const GdnCudaConfig& cfg = {});

void gdn_chunk_backward_cuda(const GdnDims& d, const __nv_bfloat16* q, const __nv_bfloat16* k,
                             const __nv_bfloat16* v, const float* beta, const float* g, const float* S_in,
                             const __nv_bfloat16* dO, const float* dS_out, __nv_bfloat16* dq, __nv_bfloat16* dk,
                             __nv_bfloat16* dv, float* dbeta, float* dg, float* dS_in, void* workspace,
                             cudaStream_t stream, const GdnCudaConfig& cfg = {});

}  // namespace stateflow
