// Causal softmax attention of one chunk's queries against the K/V rows of chunks 0..c
// (MATH.md section 7; docs/attention.md). The K/V live in sequence-wide buffers: the chunk
// owning positions [offset, offset+len) has written its rows there, and its queries read rows
// [0, offset+len). Query i sits at position offset+i and sees keys j <= offset+i (causal mask
// aligned bottom-right: q shorter than kv). Grouped K/V heads: query head h reads K/V head
// h / (q_heads / kv_heads).
//
// Layouts, row-major:
//   q, o, dout, dq      [batch, len, q_heads, head_dim]
//   k, v, dk, dv        [batch, kv_rows, kv_heads, head_dim]   (kv_rows >= offset+len)
//   lse                 [batch, len, q_heads]                  log-sum-exp of each score row
//
// forward:  o = softmax(scale q k^T, masked) v; saves lse for backward.
// backward: dq overwritten; dk, dv rows [0, offset+len) ADDED to (+=), so the K/V gradient of
//           chunk j is complete once the backward of every chunk >= j has run.
#pragma once
#include <cstdint>

namespace stateflow {

struct AttentionDims {
  int64_t batch = 1;
  int64_t len = 0;      // query rows of the chunk
  int64_t offset = 0;   // position of the chunk's first token
  int64_t kv_rows = 0;  // rows per sequence of the K/V buffers
  int64_t q_heads = 1, kv_heads = 1, head_dim = 1;
  double scale = 1.0;   // softmax scale, usually 1/sqrt(head_dim)
};

// Throws stateflow::Error naming the first inconsistent field.
void check_attention_dims(const AttentionDims& d);

template <class T>
void prefix_attention_forward(const AttentionDims& d, const T* q, const T* k, const T* v, T* o, T* lse);

template <class T>
void prefix_attention_backward(const AttentionDims& d, const T* q, const T* k, const T* v, const T* o, const T* lse,
                               const T* dout, T* dq, T* dk, T* dv);

}  // namespace stateflow
