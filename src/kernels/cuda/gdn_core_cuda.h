// Gated DeltaNet chunk core on NVIDIA GPUs (Hopper first): the chunkwise WY algorithm of
// MATH.md sections 3-4 with the semantics and layouts of the CPU API (kernels/cpu/gdn_core.h),
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
//             ST  (sequential over sub-chunks, parallel over batch x heads x dv/BV tiles)
//             Out (parallel over sub-chunks)
//   backward: B1+B2 (parallel: Pre again, storing T, plus dV_new_local)
//             B1'+B3 (one launch: per (batch, head, dv tile) one warpgroup re-runs the ST
//                     sweep forward for the sub-chunk states and V_new while a second runs
//                     the reverse dS sweep; the two are independent)
//             B4 (parallel over sub-chunks: all remaining gradients)
// Nothing is kept from forward to backward: backward recomputes Pre and the forward sweep.
// Both use a caller-provided workspace of gdn_cuda_workspace_bytes() bytes (global memory).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/cpu/gdn_core.h"

namespace stateflow {

struct GdnCudaConfig {
  // Width BV of the dv tile one ST block owns (16, 32 or 64); 0 picks the widest tile that
  // still gives at least one block per SM.
  int value_tile = 0;
  // When non-null: synchronises after each stage and writes its time in ms here
  // (3 entries for forward: Pre, ST, Out; 3 for backward: B1+B2, B1'+B3, B4). For benchmarks.
  float* stage_ms = nullptr;
};

// Bytes of device workspace both calls need for dims d (the backward need; forward uses part).
size_t gdn_cuda_workspace_bytes(const GdnDims& d);

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
