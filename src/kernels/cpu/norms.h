// Row-wise normalisations, forward and backward.
//   rmsnorm:        y = x * rstd * w,             rstd = 1/sqrt(mean(x^2) + eps)
//   gated_rmsnorm:  y = x * rstd * w * silu(z)    (GDN output norm, per head over dv)
//   l2norm:         y = x * rstd,                 rstd = 1/sqrt(sum(x^2) + eps)
// rstd[rows] is saved by forward for backward. dx/dz are overwritten; dw is accumulated (+=).
#pragma once
#include <cstdint>

namespace stateflow {

template <class T>
void rmsnorm_forward(const T* x, const T* w, T* y, T* rstd, int64_t rows, int64_t dim, double eps);
template <class T>
void rmsnorm_backward(const T* x, const T* w, const T* rstd, const T* dy, T* dx, T* dw, int64_t rows,
                      int64_t dim);

template <class T>
void gated_rmsnorm_forward(const T* x, const T* z, const T* w, T* y, T* rstd, int64_t rows, int64_t dim,
                           double eps);
template <class T>
void gated_rmsnorm_backward(const T* x, const T* z, const T* w, const T* rstd, const T* dy, T* dx, T* dz,
                            T* dw, int64_t rows, int64_t dim);

template <class T>
void l2norm_forward(const T* x, T* y, T* rstd, int64_t rows, int64_t dim, double eps);
template <class T>
void l2norm_backward(const T* y, const T* rstd, const T* dy, T* dx, int64_t rows, int64_t dim);

}  // namespace stateflow
