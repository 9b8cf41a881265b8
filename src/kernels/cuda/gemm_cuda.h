// GEMMs on the GPU through cuBLAS, with the row-major semantics of kernels/cpu/gemm.h:
// C = alpha * op(A) op(B) + beta * C, op(A) M x K, op(B) K x N, lda/ldb/ldc row strides.
// Operands are bf16 (the production path: fp32 accumulation, fp32 or bf16 result) or fp32
// (full fp32 arithmetic, no TF32: the reference path of the tests).
//
// Determinism: cuBLAS gives bitwise-equal results for the same call on the same GPU model and
// library version, provided the workspace does not change between calls; CublasGemm owns a
// fixed workspace for its handle, and atomics stay disallowed (the cuBLAS default), so
// split-K never reduces through floating-point atomics.
#pragma once
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace stateflow {

// A cuBLAS handle bound to one stream, with its own fixed workspace. One per stream/thread:
// a handle must not be used by two threads at once.
class CublasGemm {
 public:
  explicit CublasGemm(cudaStream_t stream = nullptr, size_t workspace_bytes = size_t(32) << 20);
  ~CublasGemm();
  CublasGemm(const CublasGemm&) = delete;
  CublasGemm& operator=(const CublasGemm&) = delete;

  cublasHandle_t handle() const { return handle_; }
  cudaStream_t stream() const { return stream_; }

 private:
  cublasHandle_t handle_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* workspace_ = nullptr;
};

// In: float or __nv_bfloat16; Out: float, or __nv_bfloat16 when In is.
template <class In, class Out>
void gemm_cuda(const CublasGemm& g, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const In* A, int64_t lda, const In* B, int64_t ldb, float beta, Out* C, int64_t ldc);

// Dense layers on row-major x[rows, in], W[in, out], as in kernels/cpu/gemm.h:
//   linear_forward_cuda:         y  = x W      (y overwritten)
//   linear_backward_data_cuda:   dx += dy W^T
//   linear_backward_weight_cuda: dW += x^T dy  (dW is the fp32 gradient)
template <class In, class Out>
void linear_forward_cuda(const CublasGemm& g, const In* x, const In* W, Out* y, int64_t rows, int64_t in,
                         int64_t out);
template <class In, class Out>
void linear_backward_data_cuda(const CublasGemm& g, const In* dy, const In* W, Out* dx, int64_t rows, int64_t in,
                               int64_t out);
template <class In>
void linear_backward_weight_cuda(const CublasGemm& g, const In* x, const In* dy, float* dW, int64_t rows,
                                 int64_t in, int64_t out);

// bf16 copies of fp32 values (round to nearest even): the bf16 weights the GEMMs read are
// cast from the fp32 master weights after every optimizer step.
void cast_to_bf16_cuda(const float* src, __nv_bfloat16* dst, int64_t n, cudaStream_t stream);

}  // namespace stateflow
