#include <gtest/gtest.h>

#include <cmath>

#include "kernels/cpu/swiglu.h"
#include "kernel_test_util.h"

using namespace stateflow;
using namespace stateflow::testing;

namespace {

constexpr int64_t kRows = 3 * 7, kHidden = 10, kN = kRows * kHidden;  // batch 3, len 7

template <class T>
void check_forward(double tol) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  auto a = random_vec<double>(rng, kN, 2.0), b = random_vec<double>(rng, kN);
  std::vector<double> ref(kN);
  for (int64_t i = 0; i < kN; ++i) ref[i] = a[i] / (1 + std::exp(-a[i])) * b[i];

  auto aT = as<T>(a), bT = as<T>(b);
  std::vector<T> h(kN);
  swiglu_forward<T>(aT.data(), bT.data(), h.data(), kN);
  EXPECT_LE(rel_err(h, ref), tol);
}

TEST(Swiglu, ForwardMatchesReference) {
  check_forward<double>(1e-15);
  check_forward<float>(1e-6);
}

// Gradients of L = <swiglu(a, b), dh>.
struct SwigluCase {
  std::vector<double> a, b, dh, da, db;
  explicit SwigluCase(Rng& rng)
      : a(random_vec<double>(rng, kN, 2.0)), b(random_vec<double>(rng, kN)), dh(random_vec<double>(rng, kN)),
        da(kN, NAN), db(kN, NAN) {
    swiglu_backward<double>(a.data(), b.data(), dh.data(), da.data(), db.data(), kN);
  }
  double loss() const {
    std::vector<double> h(kN);
    swiglu_forward<double>(a.data(), b.data(), h.data(), kN);
    double l = 0;
    for (int64_t i = 0; i < kN; ++i) l += h[i] * dh[i];
    return l;
  }
};

TEST(Swiglu, BackwardMatchesFiniteDifferences) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  SwigluCase s(rng);
  auto loss = [&] { return s.loss(); };
  EXPECT_LE(fd_error(loss, &s.a, s.da, rng), 1e-7) << "da";
  EXPECT_LE(fd_error(loss, &s.b, s.db, rng), 1e-7) << "db";
}

// Negative control: the FD check must flag a plausible wrong gradient (sigmoid(a) instead of
// silu(a) in db) and still pass the right one next to it.
TEST(Swiglu, FiniteDifferenceCheckFlagsWrongGradient) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  SwigluCase s(rng);
  std::vector<double> wrong_db(kN);
  for (int64_t i = 0; i < kN; ++i) wrong_db[i] = s.dh[i] / (1 + std::exp(-s.a[i]));
  auto loss = [&] { return s.loss(); };
  EXPECT_LE(fd_error(loss, &s.a, s.da, rng), 1e-7);
  EXPECT_GE(fd_error(loss, &s.b, wrong_db, rng), 1e-2);
}

TEST(Swiglu, FloatBackwardMatchesDouble) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  SwigluCase s(rng);
  auto a = as<float>(s.a), b = as<float>(s.b), dh = as<float>(s.dh);
  std::vector<float> da(kN), db(kN);
  swiglu_backward<float>(a.data(), b.data(), dh.data(), da.data(), db.data(), kN);
  EXPECT_LE(rel_err(da, s.da), 1e-6);
  EXPECT_LE(rel_err(db, s.db), 1e-6);
}

}  // namespace
