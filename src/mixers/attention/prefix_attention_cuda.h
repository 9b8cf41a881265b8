// Prefix attention on NVIDIA GPUs: the semantics of prefix_attention.h (a chunk's queries
// against K/V rows 0..offset+len-1, causal mask aligned bottom-right, grouped K/V heads),
// through cuDNN's fused attention (cudnn_attention.h) or, below, our own
// fused flash-attention kernels on tensor cores (mma.sync, bf16 operands, fp32 accumulation
// and softmax statistics). Layouts as on the CPU:
//
//   q, o, dout, dq   bf16 [batch, len, q_heads, head_dim]
//   k, v             bf16 [batch, kv_rows, kv_heads, head_dim]
//   dk, dv           fp32 [batch, kv_rows, kv_heads, head_dim]   rows [0, offset+len) ADDED to
//   lse              fp32 [batch, len, q_heads]                  natural-log row log-sum-exp
//
// Supported: head_dim 128 or 256; anything else is refused with an error saying so.
// Rows of k/v past offset+len are never read (they may hold anything).
//
// Kernels (one file, forward and backward side by side):
//   forward  per 64 query rows and head: online softmax over 64-key blocks from key 0 up.
//   backward delta = rowsum(dout * o); dK/dV per 64 key rows and K/V head, looping over the
//            query blocks that see them from the LAST down, and over the group's query heads;
//            dQ per 64 query rows and head like the forward. No atomics: deterministic.
//
// Chunk invariance (the GPU rule, tested): every query row is computed alone against key
// blocks on a fixed 64-row grid from key 0, so o, lse and dq of a row do not depend on how the
// sequence was cut. dK/dV rows are sums over query blocks, taken last block first, continuing
// from the fp32 values already in dk/dv; chunks run backward last first, so when every cut is
// a multiple of 64 rows (the trainer's 2048-token cuts are) the chunked sums are the unchunked
// ones term for term: bitwise equal. Other cuts regroup the query blocks; those stay within
// twice the unsplit run's error against float64.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "mixers/attention/prefix_attention.h"

namespace stateflow {

// The query-row and key-row block of the kernels; cuts on multiples of it are bitwise neutral.
constexpr int64_t kAttentionBlock = 64;

// Throws stateflow::Error when the GPU kernels do not support dims d (naming the field).
void check_attention_dims_cuda(const AttentionDims& d);

// Which implementation runs (STATEFLOW_ATTENTION, read once; an unknown value is refused):
//   cudnn          cuDNN's fused flash attention with its deterministic backward (default);
//                  where cuDNN is missing or refuses a shape, our kernels, said once per shape
//   kernels        our kernels below
//   cudnn-atomic   cuDNN with its faster backward whose dQ is summed with atomics: NOT
//                  deterministic (dQ's last bits vary run to run); for measurement only
enum class AttentionImpl { Cudnn, Kernels, CudnnAtomic };
AttentionImpl parse_attention_impl(const char* value);  // null or "" -> Cudnn
AttentionImpl attention_impl();
// What runs d under attention_impl(): "cuDNN 91900, forward engine ..." or "our kernels (why)".
std::string attention_impl_describe(const AttentionDims& d);

// The dispatching entry points (what the layer calls): workspace of
// prefix_attention_workspace_bytes(d) bytes, for forward and backward alike.
size_t prefix_attention_workspace_bytes(const AttentionDims& d);
void prefix_attention_forward_cuda(const AttentionDims& d, const __nv_bfloat16* q, const __nv_bfloat16* k,
                                   const __nv_bfloat16* v, __nv_bfloat16* o, float* lse, void* workspace,
                                   cudaStream_t stream);
void prefix_attention_backward_cuda(const AttentionDims& d, const __nv_bfloat16* q, const __nv_bfloat16* k,
                                    const __nv_bfloat16* v, const __nv_bfloat16* o, const float* lse,
                                    const __nv_bfloat16* dout, __nv_bfloat16* dq, float* dk, float* dv,
                                    void* workspace, cudaStream_t stream);

// Our kernels alone. Workspace: delta, 4 bytes per query row and head (backward only).
size_t prefix_attention_kernels_workspace_bytes(const AttentionDims& d);
void prefix_attention_forward_kernels(const AttentionDims& d, const __nv_bfloat16* q, const __nv_bfloat16* k,
                                      const __nv_bfloat16* v, __nv_bfloat16* o, float* lse, cudaStream_t stream);
void prefix_attention_backward_kernels(const AttentionDims& d, const __nv_bfloat16* q, const __nv_bfloat16* k,
                                       const __nv_bfloat16* v, const __nv_bfloat16* o, const float* lse,
                                       const __nv_bfloat16* dout, __nv_bfloat16* dq, float* dk, float* dv,
                                       void* workspace, cudaStream_t stream);

}  // namespace stateflow
