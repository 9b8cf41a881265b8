#include "kernels/cpu/gemm.h"

#include <cblas.h>

namespace stateflow {

void set_blas_threads(int n) { openblas_set_num_threads(n); }

static CBLAS_TRANSPOSE tr(bool t) { return t ? CblasTrans : CblasNoTrans; }

template <>
void gemm<float>(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                 const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  cblas_sgemm(CblasRowMajor, tr(ta), tr(tb), M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <>
void gemm<double>(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A,
                  int64_t lda, const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  cblas_dgemm(CblasRowMajor, tr(ta), tr(tb), M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <class T>
void gemm_reference(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda,
                    const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      T acc = 0;
      for (int64_t k = 0; k < K; ++k) {
        T a = ta ? A[k * lda + i] : A[i * lda + k];
        T b = tb ? B[j * ldb + k] : B[k * ldb + j];
        acc += a * b;
      }
      C[i * ldc + j] = alpha * acc + (beta == T(0) ? T(0) : beta * C[i * ldc + j]);
    }
}

template <class T>
void linear_forward(const T* x, const T* W, T* y, int64_t rows, int64_t in, int64_t out) {
  gemm<T>(false, false, rows, out, in, T(1), x, in, W, out, T(0), y, out);
}

template <class T>
void linear_backward_data(const T* dy, const T* W, T* dx, int64_t rows, int64_t in, int64_t out) {
  gemm<T>(false, true, rows, in, out, T(1), dy, out, W, out, T(1), dx, in);
}

template <class T>
void linear_backward_weight(const T* x, const T* dy, T* dW, int64_t rows, int64_t in, int64_t out) {
  gemm<T>(true, false, in, out, rows, T(1), x, in, dy, out, T(1), dW, out);
}

#define SF_INSTANTIATE(T)                                                                                 \
  template void gemm_reference<T>(bool, bool, int64_t, int64_t, int64_t, T, const T*, int64_t, const T*, \
                                  int64_t, T, T*, int64_t);                                              \
  template void linear_forward<T>(const T*, const T*, T*, int64_t, int64_t, int64_t);                    \
  template void linear_backward_data<T>(const T*, const T*, T*, int64_t, int64_t, int64_t);              \
  template void linear_backward_weight<T>(const T*, const T*, T*, int64_t, int64_t, int64_t);
SF_INSTANTIATE(float)
SF_INSTANTIATE(double)
#undef SF_INSTANTIATE

}  // namespace stateflow
