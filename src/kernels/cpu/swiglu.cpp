#include "kernels/cpu/swiglu.h"

#include "kernels/cpu/activations.h"

namespace stateflow {

template <class T>
void swiglu_forward(const T* a, const T* b, T* h, int64_t n) {
  for (int64_t i = 0; i < n; ++i) h[i] = silu(a[i]) * b[i];
}

template <class T>
void swiglu_backward(const T* a, const T* b, const T* dh, T* da, T* db, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    da[i] = dh[i] * b[i] * silu_grad(a[i]);
    db[i] = dh[i] * silu(a[i]);
  }
}

#define SF_INSTANTIATE(T)                                                \
  template void swiglu_forward<T>(const T*, const T*, T*, int64_t); \
  template void swiglu_backward<T>(const T*, const T*, const T*, T*, T*, int64_t);
SF_INSTANTIATE(float)
SF_INSTANTIATE(double)
#undef SF_INSTANTIATE

}  // namespace stateflow
