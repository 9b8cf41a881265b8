// Helpers shared by the CPU kernel tests, on top of test_util.h.
#pragma once
#include <cmath>
#include <functional>
#include <vector>

#include "test_util.h"

namespace stateflow::testing {

template <class T>
std::vector<T> as(const std::vector<double>& v) {
  return {v.begin(), v.end()};
}

// Central-FD check of one input's gradient, with the error taken relative to the size of the
// gradient (MATH.md section 8) rather than to the one directional derivative: for u ~ N(0, I),
// |<grad, u>| is typically |grad|_2, but now and then a direction nearly cancels it and a
// plain relative error (~0.1% of runs at 1e-7) is then FD rounding, not a wrong gradient.
inline double fd_error(const std::function<double()>& loss, std::vector<double>* input,
                       const std::vector<double>& grad, Rng& rng, double h = 1e-5) {
  double norm2 = 0;
  for (double g : grad) norm2 += g * g;
  return fd_directional(loss, {input}, {&grad}, rng, 3, h, std::sqrt(norm2));
}

}  // namespace stateflow::testing
