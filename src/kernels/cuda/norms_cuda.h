// Row-wise normalisations on the GPU with the semantics of kernels/cpu/norms.h:
//   rmsnorm:        y = x * rstd * w,             rstd = 1/sqrt(mean(x^2) + eps)
//   gated_rmsnorm:  y = x * rstd * w * silu(z)
//   l2norm:         y = x * rstd,                 rstd = 1/sqrt(sum(x^2) + eps)
// Activations x, z, y, dy, dx, dz are A = float or bf16; w, dw and rstd[rows] are fp32, and
// every sum is fp32. dx and dz are overwritten, dw is accumulated (+=).
//
// One warp per row (half or quarter of one for rows of at most 128 or 64 values); dim must be a
// multiple of 8, at most 4096, and the pointers 16-byte aligned. The dw reduction is
// deterministic and chunk-invariant: each block of kTokenBlock tokens of a sequence (tokens
// given by TokenRows) is cut into a fixed number of segments, a lane team sums one segment's
// rows in order into its own partial row of the workspace, and
// add_token_block_partials_cuda adds the blocks into dw from the last to the first.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/reduce_cuda.h"

namespace stateflow {

// Whether the calling thread's RMS-norm backwards load the fused residual (add_to_dx) with a
// row's first pass or between the second pass's stores (norm_staged off: the same results); the
// tests set it to compare.
bool& norm_staged_for_thread();

// The gated norm's z and dz as a column block of a wider matrix (the GDN's output gate, one
// GEMM's columns beside q, k and v): a token's `per_token` rows side by side, dim values apart,
// its first ld values after the previous token's (ld a multiple of 8). per_token = 0: rows dim apart.
struct GateRows {
  int64_t per_token = 0, ld = 0;
};

// Device scratch of rmsnorm_backward_cuda and gated_rmsnorm_backward_cuda.
size_t norm_backward_workspace_bytes(int64_t rows, int64_t dim, const TokenRows& tokens);

template <class A>
void rmsnorm_forward_cuda(const A* x, const float* w, A* y, float* rstd, int64_t rows, int64_t dim, double eps,
                          cudaStream_t stream);
// add_to_dx (optional, rows x dim): added to each dx value after it is rounded to A, so
// dx = A(A(dx) + add_to_dx): bitwise the separate add_inplace_cuda(dx, add_to_dx) after the
// call, in one pass (a pre-norm residual block's dx = norm backward + dy). dw_later (optional,
// both RMS kinds): dw's reduction is left to the caller (reduce_cuda.h, DwReduction).
template <class A>
void rmsnorm_backward_cuda(const A* x, const float* w, const float* rstd, const A* dy, A* dx, float* dw,
                           int64_t rows, int64_t dim, const TokenRows& tokens, void* workspace,
                           cudaStream_t stream, const A* add_to_dx = nullptr, DwReduction* dw_later = nullptr);

template <class A>
void gated_rmsnorm_forward_cuda(const A* x, const A* z, const float* w, A* y, float* rstd, int64_t rows,
                                int64_t dim, double eps, cudaStream_t stream, GateRows z_rows = {});
template <class A>
void gated_rmsnorm_backward_cuda(const A* x, const A* z, const float* w, const float* rstd, const A* dy, A* dx,
                                 A* dz, float* dw, int64_t rows, int64_t dim, const TokenRows& tokens, void* workspace,
                                 cudaStream_t stream, GateRows z_rows = {}, DwReduction* dw_later = nullptr);

template <class A>
void l2norm_forward_cuda(const A* x, A* y, float* rstd, int64_t rows, int64_t dim, double eps, cudaStream_t stream);
// Reads the forward's output y (as the CPU kernel does).
template <class A>
void l2norm_backward_cuda(const A* y, const float* rstd, const A* dy, A* dx, int64_t rows, int64_t dim,
                          cudaStream_t stream);

// Two L2 norms of the same shape (the GDN's q and k) in one launch each way, bitwise the two
// calls (which l2norm_pair_for_thread() false, STATEFLOW_LEVERS_OFF=l2norm_pair, makes; the tests
// set it to compare). Forward: x in, y and rstd out; backward: y, rstd and dy in, dx out.
bool& l2norm_pair_for_thread();
template <class A>
struct L2NormRows {
  const A* x = nullptr;
  A* y = nullptr;
  float* rstd = nullptr;
  const A* dy = nullptr;
  A* dx = nullptr;
};
template <class A>
void l2norm_forward_pair_cuda(const L2NormRows<A> (&norms)[2], int64_t rows, int64_t dim, double eps,
                              cudaStream_t stream);
template <class A>
void l2norm_backward_pair_cuda(const L2NormRows<A> (&norms)[2], int64_t rows, int64_t dim, cudaStream_t stream);

}  // namespace stateflow
