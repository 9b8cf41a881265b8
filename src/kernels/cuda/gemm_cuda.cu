#include "kernels/cuda/gemm_cuda.h"

#include <algorithm>
#include <type_traits>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"

namespace stateflow {

namespace {

void cublas_check(cublasStatus_t s, const char* what) {
  SF_CHECK(s == CUBLAS_STATUS_SUCCESS, "cuBLAS: ", what, " failed: ", cublasGetStatusName(s), " (",
           cublasGetStatusString(s), ")");
}

template <class T>
cudaDataType_t cuda_type() {
  return std::is_same_v<T, float> ? CUDA_R_32F : CUDA_R_16BF;
}

__global__ void cast_to_bf16_kernel(const float* src, __nv_bfloat16* dst, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = __float2bfloat16(src[i]);
}

}  // namespace

CublasGemm::CublasGemm(cudaStream_t stream, size_t workspace_bytes) : stream_(stream) {
  cublas_check(cublasCreate(&handle_), "cublasCreate");
  cublas_check(cublasSetStream(handle_, stream_), "cublasSetStream");
  cublas_check(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  cublas_check(cublasSetAtomicsMode(handle_, CUBLAS_ATOMICS_NOT_ALLOWED), "cublasSetAtomicsMode");
  if (workspace_bytes > 0) {
    cuda_check(cudaMalloc(&workspace_, workspace_bytes), "cudaMalloc (cuBLAS workspace)");
    cublas_check(cublasSetWorkspace(handle_, workspace_, workspace_bytes), "cublasSetWorkspace");
  }
}

CublasGemm::~CublasGemm() {
  cublasDestroy(handle_);
  cudaFree(workspace_);
}

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the same call with the
// operands swapped (a row-major matrix read column-major is its transpose).
template <class In, class Out>
void gemm_cuda(const CublasGemm& g, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const In* A,
               int64_t lda, const In* B, int64_t ldb, float beta, Out* C, int64_t ldc) {
  static_assert(std::is_same_v<In, float> || std::is_same_v<In, __nv_bfloat16>, "operands: float or bf16");
  static_assert(std::is_same_v<Out, float> || std::is_same_v<Out, In>, "result: float, or the operand type");
  if (M == 0 || N == 0) return;
  SF_CHECK(M <= INT32_MAX && N <= INT32_MAX && K <= INT32_MAX && lda <= INT32_MAX && ldb <= INT32_MAX &&
               ldc <= INT32_MAX,
           "gemm_cuda: dimensions ", M, " x ", N, " x ", K, " exceed cuBLAS's 32-bit sizes; split the rows");
  cublas_check(cublasGemmEx(g.handle(), tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, int(N),
                            int(M), int(K), &alpha, B, cuda_type<In>(), int(ldb), A, cuda_type<In>(), int(lda),
                            &beta, C, cuda_type<Out>(), int(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
}

template <class In, class Out>
void linear_forward_cuda(const CublasGemm& g, const In* x, const In* W, Out* y, int64_t rows, int64_t in,
                         int64_t out) {
  gemm_cuda<In, Out>(g, false, false, rows, out, in, 1.f, x, in, W, out, 0.f, y, out);
}

template <class In, class Out>
void linear_backward_data_cuda(const CublasGemm& g, const In* dy, const In* W, Out* dx, int64_t rows, int64_t in,
                               int64_t out) {
  gemm_cuda<In, Out>(g, false, true, rows, in, out, 1.f, dy, out, W, out, 1.f, dx, in);
}

template <class In>
void linear_backward_weight_cuda(const CublasGemm& g, const In* x, const In* dy, float* dW, int64_t rows,
                                 int64_t in, int64_t out) {
  gemm_cuda<In, float>(g, true, false, in, out, rows, 1.f, x, in, dy, out, 1.f, dW, out);
}

void cast_to_bf16_cuda(const float* src, __nv_bfloat16* dst, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 4096);
  cast_to_bf16_kernel<<<unsigned(blocks), 256, 0, stream>>>(src, dst, n);
  cuda_check_launch("cast_to_bf16_kernel");
}

#define SF_INSTANTIATE(In, Out)                                                                                 \
  template void gemm_cuda<In, Out>(const CublasGemm&, bool, bool, int64_t, int64_t, int64_t, float, const In*, \
                                   int64_t, const In*, int64_t, float, Out*, int64_t);                          \
  template void linear_forward_cuda<In, Out>(const CublasGemm&, const In*, const In*, Out*, int64_t, int64_t,  \
                                             int64_t);                                                          \
  template void linear_backward_data_cuda<In, Out>(const CublasGemm&, const In*, const In*, Out*, int64_t,     \
                                                   int64_t, int64_t);
SF_INSTANTIATE(float, float)
SF_INSTANTIATE(__nv_bfloat16, float)
SF_INSTANTIATE(__nv_bfloat16, __nv_bfloat16)
#undef SF_INSTANTIATE
template void linear_backward_weight_cuda<float>(const CublasGemm&, const float*, const float*, float*, int64_t,
                                                 int64_t, int64_t);
template void linear_backward_weight_cuda<__nv_bfloat16>(const CublasGemm&, const __nv_bfloat16*,
                                                         const __nv_bfloat16*, float*, int64_t, int64_t, int64_t);

}  // namespace stateflow
