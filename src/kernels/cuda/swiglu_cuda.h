// SwiGLU gate on the GPU with the semantics of kernels/cpu/swiglu.h: h = silu(a) * b over n
// values (A = float or bf16 storage, fp32 arithmetic); da and db are overwritten. Pointers
// must be 16-byte aligned; n may be anything (the tail past a multiple of 8 goes element-wise).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace stateflow {

template <class A>
void swiglu_forward_cuda(const A* a, const A* b, A* h, int64_t n, cudaStream_t stream);
template <class A>
void swiglu_backward_cuda(const A* a, const A* b, const A* dh, A* da, A* db, int64_t n, cudaStream_t stream);

}  // namespace stateflow
