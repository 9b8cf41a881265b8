// Element-wise helpers of the GPU training step: the residual add y += x (A = float or bf16,
// fp32 arithmetic, one rounding to A), and the two halves of gradient-norm clipping.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace stateflow {

template <class A>
void add_inplace_cuda(A* y, const A* x, int64_t n, cudaStream_t stream);

// Sum of x[i]^2 in double, in a fixed order (the same bits on every run); synchronises.
double sum_squares_cuda(const float* x, int64_t n, cudaStream_t stream);
// x[i] = float(x[i] * factor), factor in double as the CPU scale_grads computes it.
void scale_inplace_cuda(float* x, double factor, int64_t n, cudaStream_t stream);

}  // namespace stateflow
