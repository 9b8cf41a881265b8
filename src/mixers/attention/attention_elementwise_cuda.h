// The attention layer's element-wise GPU work (bf16 activations, fp32 arithmetic): RoPE at
// global positions (rope.h's semantics; angles in double from the position, so every chunking
// rotates a token bitwise alike), the sigmoid output gate, and moving a chunk's rows into and
// out of the sequence-wide K/V prefix buffers.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "mixers/attention/rope.h"

namespace stateflow {

// x [batch, len, heads, head_dim] in place; backward rotates by the opposite angle.
void rope_forward_cuda(const RopeDims& d, __nv_bfloat16* x, cudaStream_t stream);
void rope_backward_cuda(const RopeDims& d, __nv_bfloat16* dx, cudaStream_t stream);

// y = o * sigmoid(g); backward: do = dy * s, dg = dy * o * s * (1 - s). n elements each.
void sigmoid_gate_forward_cuda(const __nv_bfloat16* o, const __nv_bfloat16* g, __nv_bfloat16* y, int64_t n,
                               cudaStream_t stream);
void sigmoid_gate_backward_cuda(const __nv_bfloat16* o, const __nv_bfloat16* g, const __nv_bfloat16* dy,
                                __nv_bfloat16* d_o, __nv_bfloat16* dg, int64_t n, cudaStream_t stream);

// The rows of one chunk in a prefix buffer [batch, seq_len, width] (width = kv_heads x head_dim):
// rows [offset, offset + len) of every sequence, against a chunk tensor [batch, len, width].
struct PrefixRows {
  int64_t batch, seq_len, offset, len, width;
};
// buf rows <- t (bf16, a copy).
void write_prefix_rows_cuda(const PrefixRows& r, const __nv_bfloat16* t, __nv_bfloat16* buf, cudaStream_t stream);
// t <- buf rows rounded to bf16, and those rows of the fp32 gradient buffer zeroed (taken out).
void take_prefix_rows_cuda(const PrefixRows& r, float* buf, __nv_bfloat16* t, cudaStream_t stream);

}  // namespace stateflow
