// Helpers shared by the tests: fresh random inputs, error metrics and finite differences.
#pragma once
#include <cstdlib>
#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "core/rng.h"

namespace stateflow::testing {

// A fresh seed per call (printed by the caller on failure), so every run tests new inputs.
// A new seed per run, or STATEFLOW_TEST_SEED's value to replay a failure (tests print their
// seed with SCOPED_TRACE when they fail).
inline uint64_t fresh_seed() {
  if (const char* fixed = std::getenv("STATEFLOW_TEST_SEED")) return std::strtoull(fixed, nullptr, 10);
  return std::random_device{}() * 0x100000001ull + std::random_device{}();
}

template <class T>
std::vector<T> random_vec(Rng& rng, size_t n, double scale = 1.0) {
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(scale * rng.normal());
  return v;
}

// max|a - ref| / max|ref| (MATH.md section 8's normwise metric).
template <class A, class B>
double rel_err(const std::vector<A>& a, const std::vector<B>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::abs(double(a[i]) - double(ref[i])));
    den = std::max(den, std::abs(double(ref[i])));
  }
  return den == 0 ? num : num / den;
}

// ||a - ref||_2 / ||ref||_2: the whole tensor's error, steadier than the worst entry when two
// runs' errors are compared (a single token can dominate the max of either).
template <class A, class B>
double rms_rel_err(const std::vector<A>& a, const std::vector<B>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = double(a[i]) - double(ref[i]);
    num += d * d, den += double(ref[i]) * double(ref[i]);
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

// The derivative at 0 of s -> loss() after shift(s) has moved the inputs by s along one
// direction, by the fourth-order central difference (8 (L(h) - L(-h)) - (L(2h) - L(-2h))) / 12h;
// the inputs end where they began. Fourth order because the plain (L(h) - L(-h)) / 2h has an
// O(h^2) error that, where a parameter enters through exponentials of long sums, reached 4e-6 of
// the gradient at h = 1e-5 (mamba3's dt_bias and Wang, seed 18306695422346167970): a failing
// check of a correct backward. This one's truncation error is O(h^4) (at most 2e-10 there).
inline double central_difference(const std::function<double()>& loss, const std::function<void(double)>& shift,
                                 double h) {
  shift(h);
  const double l1 = loss();
  shift(h);
  const double l2 = loss();
  shift(-3 * h);
  const double m1 = loss();
  shift(-h);
  const double m2 = loss();
  shift(2 * h);
  return (8 * (l1 - m1) - (l2 - m2)) / (12 * h);
}

// Directional central finite differences in float64. `inputs` are the tensors the scalar
// loss depends on and `grads` the hand-written gradients of the loss w.r.t. them. For each
// of `n_dirs` random directions u, compares central_difference along u with sum <grad, u>.
// Returns the worst |fd - analytic| / max(|analytic|, |fd|, floor).
// A direction whose terms grad_j u_j cancel to under kFdCancellation of their magnitude is drawn
// again (up to 8 times): the quotient's truncation and rounding errors scale with the loss, not
// with that small net, so such a draw measures noise (seen: a net 2e4 times below its terms).
inline constexpr double kFdCancellation = 1e-3;

inline double fd_directional(const std::function<double()>& loss, const std::vector<std::vector<double>*>& inputs,
                             const std::vector<const std::vector<double>*>& grads, Rng& rng, int n_dirs = 3,
                             double h = 1e-5, double floor = 1e-8) {
  double worst = 0;
  for (int d = 0; d < n_dirs; ++d) {
    std::vector<std::vector<double>> dirs;
    double analytic = 0;
    for (int draw = 0; draw < 8; ++draw) {
      dirs.clear();
      analytic = 0;
      double magnitude = 0;
      for (size_t i = 0; i < inputs.size(); ++i) {
        dirs.push_back(random_vec<double>(rng, inputs[i]->size()));
        for (size_t j = 0; j < dirs[i].size(); ++j) {
          analytic += (*grads[i])[j] * dirs[i][j];
          magnitude += std::abs((*grads[i])[j] * dirs[i][j]);
        }
      }
      if (std::abs(analytic) >= kFdCancellation * magnitude) break;
    }
    auto shift = [&](double s) {
      for (size_t i = 0; i < inputs.size(); ++i)
        for (size_t j = 0; j < dirs[i].size(); ++j) (*inputs[i])[j] += s * dirs[i][j];
    };
    const double fd = central_difference(loss, shift, h);
    worst = std::max(worst, std::abs(fd - analytic) / std::max({std::abs(analytic), std::abs(fd), floor}));
  }
  return worst;
}


// Expects fn() to throw stateflow::Error with `needle` in its message (checks that user
// errors name the problem).
template <class Fn>
void expect_error(Fn&& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "expected an Error mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace stateflow::testing
