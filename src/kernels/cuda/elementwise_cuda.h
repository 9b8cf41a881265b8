// Element-wise helpers of the GPU training step: the residual add y += x (A = float or bf16,
// fp32 arithmetic, one rounding to A), and the two halves of gradient-norm clipping.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace stateflow {

template <class A>
void add_inplace_cuda(A* y, const A* x, int64_t n, cudaStream_t stream);
// Whether the calling thread's add_inplace_cuda works on 8 values a thread where both arrays are
// 16-byte aligned (lever add_vectors) or on one: the same results; the tests set it to compare.
bool& add_vectors_for_thread();

// n floats in device memory.
struct DeviceFloats {
  const float* data;
  int64_t n;
};
// Sum of x[i]^2 over every array of xs, in double, in a fixed order (the same bits on every
// run): each array's partial sums go to one device buffer, which one block then sums, so the
// host waits once for the lot rather than once per array.
double sum_squares_cuda(const std::vector<DeviceFloats>& xs, cudaStream_t stream);
// x[i] = float(x[i] * factor), factor in double as the CPU scale_grads computes it.
void scale_inplace_cuda(float* x, double factor, int64_t n, cudaStream_t stream);

}  // namespace stateflow
