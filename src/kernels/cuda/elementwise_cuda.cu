#include "kernels/cuda/elementwise_cuda.h"

#include <cuda_bf16.h>

#include <algorithm>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/levers.h"

namespace stateflow {

namespace {
template <class A>
__global__ void add_inplace_kernel(A* y, const A* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = A(float(y[i]) + float(x[i]));
}

// The same sums 8 values a thread at a time, 16-byte loads and stores (add_vectors): a residual
// add at a 1K-token chunk is 2M bf16 values, and one value a thread left it mostly launch and
// index arithmetic. The last n % 8 values are block 0's.
template <class A>
__global__ void add_inplace_vectors_kernel(A* y, const A* x, int64_t n) {
  const int64_t vectors = n / 8;
  for (int64_t v = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; v < vectors; v += int64_t(gridDim.x) * blockDim.x) {
    float a[8], b[8];
    cuda::load8(y + 8 * v, a), cuda::load8(x + 8 * v, b);
#pragma unroll
    for (int e = 0; e < 8; ++e) a[e] = a[e] + b[e];
    cuda::store8(y + 8 * v, a);
  }
  const int64_t i = 8 * vectors + threadIdx.x;
  if (blockIdx.x == 0 && i < n) y[i] = A(float(y[i]) + float(x[i]));
}

constexpr int kSumBlocks = 264;  // fixed, so the reduction order never changes
constexpr int kSumThreads = 256;

// The block's total of each thread's s, by a fixed tree; valid in thread 0.
__device__ double block_sum(double s) {
  __shared__ double part[kSumThreads];
  part[threadIdx.x] = s;
  __syncthreads();
  for (int w = kSumThreads / 2; w > 0; w /= 2) {
    if (int(threadIdx.x) < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  return part[0];
}

// partials[b] = block b's share of sum x[i]^2 (kSumBlocks blocks; zero when n == 0).
__global__ void sum_squares_kernel(const float* x, int64_t n, double* partials) {
  double s = 0;
  for (int64_t i = blockIdx.x * int64_t(kSumThreads) + threadIdx.x; i < n; i += int64_t(kSumBlocks) * kSumThreads)
    s += double(x[i]) * double(x[i]);
  s = block_sum(s);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// out[0] = sum of x[0..n), one block.
__global__ void sum_kernel(const double* x, int64_t n, double* out) {
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += kSumThreads) s += x[i];
  s = block_sum(s);
  if (threadIdx.x == 0) out[0] = s;
}

__global__ void scale_inplace_kernel(float* x, double factor, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = float(double(x[i]) * factor);
}
}  // namespace

template <class A>
void add_inplace_cuda(A* y, const A* x, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  const int threads = 256;
  if (add_vectors_for_thread() && reinterpret_cast<uintptr_t>(y) % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0) {
    const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>((n / 8 + threads - 1) / threads, 65536));
    add_inplace_vectors_kernel<A><<<unsigned(blocks), threads, 0, stream>>>(y, x, n);
    cuda_check_launch("add_inplace_vectors_kernel");
    return;
  }
  const int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, 65536);
  add_inplace_kernel<A><<<unsigned(blocks), threads, 0, stream>>>(y, x, n);
  cuda_check_launch("add_inplace_kernel");
}

bool& add_vectors_for_thread() {
  thread_local bool vectors = !lever_off("add_vectors");
  return vectors;
}

double sum_squares_cuda(const std::vector<DeviceFloats>& xs, cudaStream_t stream) {
  if (xs.empty()) return 0;
  const int64_t n_partials = int64_t(xs.size()) * kSumBlocks;
  double* partials = nullptr;  // n_partials block sums, then the total
  cuda_check(cudaMallocAsync(&partials, (n_partials + 1) * sizeof(double), stream), "cudaMallocAsync");
  for (size_t k = 0; k < xs.size(); ++k) {
    sum_squares_kernel<<<kSumBlocks, kSumThreads, 0, stream>>>(xs[k].data, xs[k].n, partials + k * kSumBlocks);
    cuda_check_launch("sum_squares_kernel");
  }
  sum_kernel<<<1, kSumThreads, 0, stream>>>(partials, n_partials, partials + n_partials);
  cuda_check_launch("sum_kernel");
  double sum = 0;
  cuda_check(cudaMemcpyAsync(&sum, partials + n_partials, sizeof sum, cudaMemcpyDeviceToHost, stream),
             "cudaMemcpyAsync");
  cuda_check(cudaFreeAsync(partials, stream), "cudaFreeAsync");
  cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return sum;
}

void scale_inplace_cuda(float* x, double factor, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 65536);
  scale_inplace_kernel<<<unsigned(blocks), 256, 0, stream>>>(x, factor, n);
  cuda_check_launch("scale_inplace_kernel");
}

template void add_inplace_cuda<float>(float*, const float*, int64_t, cudaStream_t);
template void add_inplace_cuda<__nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*, int64_t, cudaStream_t);

}  // namespace stateflow
