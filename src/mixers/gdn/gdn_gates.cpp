#include "mixers/gdn/gdn_gates.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/activations.h"

namespace stateflow {

template <class T>
void gdn_gates_forward(const T* a, const T* b, const T* A_log, const T* dt_bias, T* g, T* beta, int64_t rows,
                       int64_t heads) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t i = r * heads + h;
      beta[i] = sigmoid(b[i]);
      g[i] = -std::exp(A_log[h]) * softplus(a[i] + dt_bias[h]);
    }
}

// d g / d A_log = g;  d g / d a = -exp(A_log) sigmoid(a + dt_bias) = d g / d dt_bias.
template <class T>
void gdn_gates_backward(const T* a, const T* b, const T* A_log, const T* dt_bias, const T* dg, const T* dbeta,
                        T* da, T* db, T* dA_log, T* ddt_bias, int64_t rows, int64_t heads) {
  // Per-head parameter gradients sum over every row: accumulate in double.
  std::vector<double> dA_log_sum(heads, 0.0), ddt_bias_sum(heads, 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t i = r * heads + h;
      const T decay_rate = std::exp(A_log[h]);
      const T x = a[i] + dt_bias[h];
      const T g = -decay_rate * softplus(x);
      da[i] = -dg[i] * decay_rate * sigmoid(x);
      const T beta = sigmoid(b[i]);
      db[i] = dbeta[i] * beta * (T(1) - beta);
      dA_log_sum[h] += double(dg[i]) * double(g);
      ddt_bias_sum[h] += double(da[i]);
    }
  for (int64_t h = 0; h < heads; ++h) {
    dA_log[h] += T(dA_log_sum[h]);
    ddt_bias[h] += T(ddt_bias_sum[h]);
  }
}

#define SF_INSTANTIATE(T)                                                                                       \
  template void gdn_gates_forward<T>(const T*, const T*, const T*, const T*, T*, T*, int64_t, int64_t); \
  template void gdn_gates_backward<T>(const T*, const T*, const T*, const T*, const T*, const T*, T*, T*, T*, T*, \
                                      int64_t, int64_t);
SF_INSTANTIATE(float)
SF_INSTANTIATE(double)
#undef SF_INSTANTIATE

}  // namespace stateflow
