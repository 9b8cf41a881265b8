#include "kernels/cpu/adamw.h"

#include <cmath>

#include "core/error.h"

namespace stateflow {

void AdamWConfig::validate() const {
  SF_CHECK(beta1 >= 0 && beta1 < 1, "AdamW beta1 = ", beta1, " must be in [0, 1)");
  SF_CHECK(beta2 >= 0 && beta2 < 1, "AdamW beta2 = ", beta2, " must be in [0, 1)");
  SF_CHECK(eps > 0 && std::isfinite(eps), "AdamW eps = ", eps, " must be positive");
  SF_CHECK(weight_decay >= 0 && std::isfinite(weight_decay), "AdamW weight_decay = ", weight_decay,
           " must be >= 0");
}

template <class T>
void adamw_update(T* p, const T* g, T* m, T* v, int64_t n, double lr, double decay, const AdamWConfig& c,
                  int64_t step) {
  const double bias1 = 1 - std::pow(c.beta1, static_cast<double>(step));
  const double bias2 = 1 - std::pow(c.beta2, static_cast<double>(step));
  for (int64_t i = 0; i < n; ++i) {
    double gi = g[i];
    double mi = c.beta1 * m[i] + (1 - c.beta1) * gi;
    double vi = c.beta2 * v[i] + (1 - c.beta2) * gi * gi;
    double pi = p[i] * (1 - lr * decay);
    p[i] = static_cast<T>(pi - lr * (mi / bias1) / (std::sqrt(vi / bias2) + c.eps));
    m[i] = static_cast<T>(mi);
    v[i] = static_cast<T>(vi);
  }
}

template void adamw_update<float>(float*, const float*, float*, float*, int64_t, double, double, const AdamWConfig&,
                                  int64_t);
template void adamw_update<double>(double*, const double*, double*, double*, int64_t, double, double,
                                   const AdamWConfig&, int64_t);

}  // namespace stateflow
