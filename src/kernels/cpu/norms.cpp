#include "kernels/cpu/norms.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/activations.h"

namespace stateflow {

// Row sums of squares accumulate in double: these CPU kernels are the reference the
// device kernels are compared with.
template <class T>
static double sum_squares(const T* x, int64_t dim) {
  double s = 0;
  for (int64_t i = 0; i < dim; ++i) s += double(x[i]) * double(x[i]);
  return s;
}

template <class T>
static T rms_rstd(const T* x, int64_t dim, double eps) {
  return T(1.0 / std::sqrt(sum_squares(x, dim) / double(dim) + eps));
}

// Input gradient shared by both RMS norms, given dn = dL/dn for n = x * rstd:
//   dx = rstd * (dn - n * mean(dn * n)).
template <class T>
static void rms_input_grad(const T* x, T rstd, const T* dn, T* dx, int64_t dim) {
  double dot = 0;
  for (int64_t i = 0; i < dim; ++i) dot += double(dn[i]) * double(x[i] * rstd);
  const T mean_dn_n = T(dot / double(dim));
  for (int64_t i = 0; i < dim; ++i) dx[i] = rstd * (dn[i] - x[i] * rstd * mean_dn_n);
}

template <class T>
static void add_to(T* dw, const std::vector<double>& sum) {
  for (size_t i = 0; i < sum.size(); ++i) dw[i] += T(sum[i]);
}

template <class T>
void rmsnorm_forward(const T* x, const T* w, T* y, T* rstd, int64_t rows, int64_t dim, double eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    T* yr = y + r * dim;
    rstd[r] = rms_rstd(xr, dim, eps);
    for (int64_t i = 0; i < dim; ++i) yr[i] = xr[i] * rstd[r] * w[i];
  }
}

template <class T>
void rmsnorm_backward(const T* x, const T* w, const T* rstd, const T* dy, T* dx, T* dw, int64_t rows,
                      int64_t dim) {
  std::vector<T> dn(dim);
  std::vector<double> dw_sum(dim, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    const T* dyr = dy + r * dim;
    for (int64_t i = 0; i < dim; ++i) {
      dn[i] = dyr[i] * w[i];
      dw_sum[i] += double(dyr[i]) * double(xr[i] * rstd[r]);
    }
    rms_input_grad(xr, rstd[r], dn.data(), dx + r * dim, dim);
  }
  add_to(dw, dw_sum);
}

template <class T>
void gated_rmsnorm_forward(const T* x, const T* z, const T* w, T* y, T* rstd, int64_t rows, int64_t dim,
                           double eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    const T* zr = z + r * dim;
    T* yr = y + r * dim;
    rstd[r] = rms_rstd(xr, dim, eps);
    for (int64_t i = 0; i < dim; ++i) yr[i] = xr[i] * rstd[r] * w[i] * silu(zr[i]);
  }
}

template <class T>
void gated_rmsnorm_backward(const T* x, const T* z, const T* w, const T* rstd, const T* dy, T* dx, T* dz,
                            T* dw, int64_t rows, int64_t dim) {
  std::vector<T> dn(dim);
  std::vector<double> dw_sum(dim, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    const T* zr = z + r * dim;
    const T* dyr = dy + r * dim;
    T* dzr = dz + r * dim;
    for (int64_t i = 0; i < dim; ++i) {
      const T n = xr[i] * rstd[r];
      const T gate = silu(zr[i]);
      dn[i] = dyr[i] * w[i] * gate;
      dzr[i] = dyr[i] * n * w[i] * silu_grad(zr[i]);
      dw_sum[i] += double(dyr[i]) * double(n * gate);
    }
    rms_input_grad(xr, rstd[r], dn.data(), dx + r * dim, dim);
  }
  add_to(dw, dw_sum);
}

template <class T>
void l2norm_forward(const T* x, T* y, T* rstd, int64_t rows, int64_t dim, double eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    T* yr = y + r * dim;
    rstd[r] = T(1.0 / std::sqrt(sum_squares(xr, dim) + eps));
    for (int64_t i = 0; i < dim; ++i) yr[i] = xr[i] * rstd[r];
  }
}

// dx = rstd * (dy - y (y . dy)); exact also with eps, since dy/dx = rstd (I - y y^T).
template <class T>
void l2norm_backward(const T* y, const T* rstd, const T* dy, T* dx, int64_t rows, int64_t dim) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* yr = y + r * dim;
    const T* dyr = dy + r * dim;
    T* dxr = dx + r * dim;
    double dot = 0;
    for (int64_t i = 0; i < dim; ++i) dot += double(yr[i]) * double(dyr[i]);
    for (int64_t i = 0; i < dim; ++i) dxr[i] = rstd[r] * (dyr[i] - yr[i] * T(dot));
  }
}

#define SF_INSTANTIATE(T)                                                                                  \
  template void rmsnorm_forward<T>(const T*, const T*, T*, T*, int64_t, int64_t, double);                \
  template void rmsnorm_backward<T>(const T*, const T*, const T*, const T*, T*, T*, int64_t, int64_t);   \
  template void gated_rmsnorm_forward<T>(const T*, const T*, const T*, T*, T*, int64_t, int64_t, double); \
  template void gated_rmsnorm_backward<T>(const T*, const T*, const T*, const T*, const T*, T*, T*, T*,   \
                                          int64_t, int64_t);                                              \
  template void l2norm_forward<T>(const T*, T*, T*, int64_t, int64_t, double);                            \
  template void l2norm_backward<T>(const T*, const T*, const T*, T*, int64_t, int64_t);
SF_INSTANTIATE(float)
SF_INSTANTIATE(double)
#undef SF_INSTANTIATE

}  // namespace stateflow
