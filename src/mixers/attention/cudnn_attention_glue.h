// The glue between cuDNN's fused attention and our layouts (cudnn_attention_cuda.cpp): cuDNN 9
// keeps the softmax statistics head-major [batch, heads, len] (other strides are not honoured
// before 9.26), ours are token-major [batch, len, heads]; and cuDNN writes dK/dV for the rows it
// read, where our fp32 gradient prefix must be ADDED to (every later chunk has left its share).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace stateflow {

// Softmax statistics from head-major [batch, heads, len] (packed) to token-major [batch, len,
// heads] with `rows` >= len rows per sequence (a piece of a longer chunk), or back
// (to_tokens false: src token-major, dst head-major). fp32.
void transpose_lse_cuda(const float* src, float* dst, int64_t batch, int64_t heads, int64_t len, int64_t rows,
                        bool to_tokens, cudaStream_t stream);

// dst[b, r, :] += src[b, r, :] for rows r < rows; src bf16 [batch, rows, width] packed, dst
// fp32 [batch, dst_rows, width] (the prefix gradient buffer). width a multiple of 8; both 16-byte aligned.
void add_prefix_rows_cuda(const __nv_bfloat16* src, float* dst, int64_t batch, int64_t rows, int64_t dst_rows,
                          int64_t width, cudaStream_t stream);

}  // namespace stateflow
