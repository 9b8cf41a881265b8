// Causal depthwise short conv1d + SiLU with a carried (K-1)-row prefix on the GPU, with the
// semantics and layouts of kernels/cpu/short_conv.h (MATH.md section 5):
//   x, y, dy, dx        A [batch, len, ch]      (A = float or bf16)
//   prefix, prefix_out  A [batch, K-1, ch]      prefix == nullptr: zeros (first chunk)
//   dprefix_out, dprefix_in  fp32 [batch, K-1, ch]   dprefix_out == nullptr: zero (last chunk)
//   w, dw               fp32 [ch, K]
// The boundary gradients stay fp32 so that carrying them between chunks adds no rounding
// step of the activation type. dx and dprefix_in are overwritten, dw is accumulated (+=).
// prefix_out must not alias prefix (the CPU kernel allows it; here threads would race).
//
// Each thread walks a tile of rows for 2 channels (8 with STATEFLOW_LEVERS_OFF=conv_narrow: the
// same results) with the K-row window in registers; the forward's tiles shrink for short
// chunks (no reduction: any tiling gives the same rows), the backward's are 16 rows or, where
// the launch still has threads enough, whole token blocks. Chunk invariance (cuts at multiples of kTokenBlock give the unsplit
// results bitwise): the backward tiles' dw partial sums are summed per token block in order,
// and the blocks added into dw last block first (add_token_block_partials_cuda); and the
// gradient of a row that reaches the next chunk starts from the carried dprefix_out, whose
// terms come first in the unsplit sum.
// Supported: 1 <= K <= 8, ch a multiple of 8, 16-byte aligned pointers. The group calls' x (and
// the backward's dx) may be column blocks of wider matrices: rows ld_x (ld_dx) values apart, a
// multiple of 8 (0: ch, as above); the GDN's q, k, v projections come as one GEMM's columns.
//
// The group calls run up to kMaxConvGroup convs over the same batch, len and K (each with its
// own width and tensors: the GDN's q, k and v convs) in one launch, as a short chunk's conv
// alone leaves most of the GPU idle; each conv's results are bitwise those of its own call
// (STATEFLOW_LEVERS_OFF=conv_group launches them one by one).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/reduce_cuda.h"

namespace stateflow {

constexpr int kMaxConvGroup = 4;

// One conv of a forward group: its tensors (as short_conv_forward_cuda's) and width.
template <class A>
struct ShortConvForward {
  const A* x;
  const A* prefix;
  const float* w;
  A* y;
  A* prefix_out;
  int64_t ch;
  int64_t ld_x = 0;  // x's row stride (0: ch)
};

// One conv of a backward group: its tensors and workspace (as short_conv_backward_cuda's).
template <class A>
struct ShortConvBackward {
  const A* x;
  const A* prefix;
  const float* w;
  const A* dy;
  const float* dprefix_out;
  A* dx;
  float* dprefix_in;
  float* dw;
  int64_t ch;
  void* workspace;  // short_conv_backward_workspace_bytes(batch, len, ch, K)
  int64_t ld_x = 0, ld_dx = 0;  // x's and dx's row strides (0: ch)
};

template <class A>
void short_conv_forward_group_cuda(const ShortConvForward<A>* convs, int n, int64_t batch, int64_t len, int64_t K,
                                   cudaStream_t stream);
// dw_later (optional): the dw reductions are left to the caller (reduce_cuda.h, DwReduction).
template <class A>
void short_conv_backward_group_cuda(const ShortConvBackward<A>* convs, int n, int64_t batch, int64_t len, int64_t K,
                                    cudaStream_t stream, DwReduction* dw_later = nullptr);

template <class A>
void short_conv_forward_cuda(const A* x, const A* prefix, const float* w, A* y, A* prefix_out, int64_t batch,
                             int64_t len, int64_t ch, int64_t K, cudaStream_t stream);

// Whether the calling thread's launches give a thread 2 channels (default) or 8
// (STATEFLOW_LEVERS_OFF=conv_narrow); the tests set it to compare the two.
bool& short_conv_narrow_for_thread();

size_t short_conv_backward_workspace_bytes(int64_t batch, int64_t len, int64_t ch, int64_t K);
// Whether a backward launch of these shapes (channels: all its convs') gives each thread a whole
// token block (long chunks) rather than a 16-row segment of one: the same bits either way.
bool short_conv_backward_walks_blocks(int64_t batch, int64_t len, int64_t channels, int64_t K);

template <class A>
void short_conv_backward_cuda(const A* x, const A* prefix, const float* w, const A* dy, const float* dprefix_out,
                              A* dx, float* dprefix_in, float* dw, int64_t batch, int64_t len, int64_t ch, int64_t K,
                              void* workspace, cudaStream_t stream);

}  // namespace stateflow
