// SwiGLU gate on the GPU with the semantics of kernels/cpu/swiglu.h: h = silu(a) * b over n
// values (A = float or bf16 storage, fp32 arithmetic); da and db are overwritten. Pointers
// must be 16-byte aligned; n may be anything (the tail past a multiple of 8 goes element-wise).
// With ld > cols, a, b, da and db are column blocks of wider matrices (the MLP's x W1 and x W3 as
// one GEMM's columns): n / cols rows of cols values (a multiple of 8), rows ld values apart; h
// and dh stay [n / cols, cols].
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace stateflow {

template <class A>
void swiglu_forward_cuda(const A* a, const A* b, A* h, int64_t n, cudaStream_t stream, int64_t cols = 0,
                         int64_t ld = 0);
template <class A>
void swiglu_backward_cuda(const A* a, const A* b, const A* dh, A* da, A* db, int64_t n, cudaStream_t stream,
                          int64_t cols = 0, int64_t ld = 0);

}  // namespace stateflow
