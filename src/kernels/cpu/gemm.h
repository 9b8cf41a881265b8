// GEMM through BLAS (OpenBLAS): C = alpha * op(A) op(B) + beta * C, row-major.
// op(A) is M x K, op(B) is K x N, C is M x N. lda/ldb/ldc are row strides.
#pragma once
#include <cstdint>

namespace stateflow {

template <class T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda,
          const T* B, int64_t ldb, T beta, T* C, int64_t ldc);

// Threads BLAS may use inside one call. Stages that run on their own threads set 1: BLAS
// threads on top of stage threads oversubscribe the cores and spin against each other.
void set_blas_threads(int n);

// Plain triple loop: the reference that gemm is tested against.
template <class T>
void gemm_reference(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
                    int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc);

// Dense layer helpers on row-major activations x[rows, in] and weights W[in, out]:
//   linear_forward:       y  = x W              (y overwritten)
//   linear_backward_data: dx += dy W^T
//   linear_backward_weight: dW += x^T dy
template <class T>
void linear_forward(const T* x, const T* W, T* y, int64_t rows, int64_t in, int64_t out);
template <class T>
void linear_backward_data(const T* dy, const T* W, T* dx, int64_t rows, int64_t in, int64_t out);
template <class T>
void linear_backward_weight(const T* x, const T* dy, T* dW, int64_t rows, int64_t in, int64_t out);

}  // namespace stateflow
