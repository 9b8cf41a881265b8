// Mamba-3 chunk core on NVIDIA GPUs (Hopper first): the chunked form of docs/mamba3.md with
// the semantics and layouts of the CPU API (mixers/mamba3/mamba3_core.h), bf16 storage for the
// per-token vectors and fp32 for everything else.
//
//   x, y, dx, dy          bf16 [batch, len, heads, rank, P]
//   b, c, db, dc          bf16 [batch, len, heads, rank, N]   (already rotated)
//   adt, dt, lam + grads  fp32 [batch, len, heads]
//   D                     fp32 [heads];  dD fp32 [heads] is ADDED to (see below)
//   edge S                fp32 [batch, heads, P, N]
//   edge x_prev, b_prev   fp32 [batch, heads, rank, P] / [batch, heads, rank, N]
//   edge gradients        fp32, the same shapes
// A null edge input (or edge gradient input) means zeros. Every other output is overwritten.
//
// Supported: P = 64, N = 128, rank 1, 2 or 4, any len >= 1. A sub-chunk is 64 rows, one per
// (token, rank): 64 / rank tokens (Mamba3Dims::block is not used here).
//
// How the work fills the GPU at batch 1: the state after a sub-chunk is affine in the state
// before it, S_out = e_L S~ + U with a scalar e_L per (head, sub-chunk). So
//   contrib (parallel over sub-chunks):  U_n and e_L(n)
//   scan    (parallel over the P x N state entries of every head): S~_n for all n in fp32,
//           folding in the previous token's trapezoid term at each sub-chunk entry
//   out     (parallel over sub-chunks):  y from S~_n and the sub-chunk's own tokens
// and backward mirrors it (contrib of dy, reverse scan, the fold's gradient, then one kernel
// for every per-token gradient). No kernel walks a head's sequence with tensor-core work, and
// none uses floating-point atomics: results are bitwise repeatable.
//
// Chunk invariance: the scans perform the same fp32 operations whether a sub-chunk boundary
// is inside the call or is the call's edge (the edge's x_prev/b_prev hold the bf16 inputs
// exactly), and dD is reduced through add_token_block_partials_cuda (kernels/cuda/reduce_cuda.h).
// So a sequence cut at multiples of 64 tokens (kTokenBlock, a multiple of every sub-chunk),
// with edges passed on unrounded, gives bitwise the uncut run's results, dD included when the
// chunks' backward passes run last chunk first into the same dD.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "mixers/mamba3/mamba3_core.h"

namespace stateflow {

struct Mamba3CudaInputs {
  const __nv_bfloat16 *x, *b, *c;
  const float *adt, *dt, *lam, *D;
};

struct Mamba3CudaGrads {
  __nv_bfloat16 *x, *b, *c;
  float *adt, *dt, *lam;
  float* D;  // [heads], accumulated into (chunk-invariant order)
};

struct Mamba3CudaConfig {
  // When non-null: synchronises after each stage and writes its time in ms here (forward:
  // 3 entries contrib, scan, out; backward: 6 entries contrib (recompute), scan (recompute),
  // contrib of dy, reverse scan, fold, grads). For benchmarks.
  float* stage_ms = nullptr;
};

// Bytes of device workspace both calls need for dims d; throws Error for unsupported dims.
size_t mamba3_cuda_workspace_bytes(const Mamba3Dims& d);

// edge_out: S, x_prev and b_prev all required.
void mamba3_chunk_forward_cuda(const Mamba3Dims& d, const Mamba3CudaInputs& in, const Mamba3Edge<float>& edge_in,
                               __nv_bfloat16* y, const Mamba3EdgeOut<float>& edge_out, void* workspace,
                               cudaStream_t stream, const Mamba3CudaConfig& cfg = {});

// dedge_out: the gradient of the edge the forward emitted (null members: zero); dedge_in:
// the gradient of edge_in, all three required.
void mamba3_chunk_backward_cuda(const Mamba3Dims& d, const Mamba3CudaInputs& in, const Mamba3Edge<float>& edge_in,
                                const __nv_bfloat16* dy, const Mamba3Edge<float>& dedge_out,
                                const Mamba3CudaGrads& grads, const Mamba3EdgeOut<float>& dedge_in, void* workspace,
                                cudaStream_t stream, const Mamba3CudaConfig& cfg = {});

}  // namespace stateflow
