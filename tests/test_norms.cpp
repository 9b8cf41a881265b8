#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "kernels/cpu/activations.h"
#include "kernels/cpu/norms.h"
#include "kernel_test_util.h"

using namespace stateflow;
using namespace stateflow::testing;

namespace {

constexpr int64_t kRows = 3 * 5, kDim = 16;  // batch 3, len 5
constexpr double kRmsEps = 1e-5, kL2Eps = 1e-6;

// Rows of N(0, 1) values, with row 1 scaled down so that eps shifts its norm by ~0.1%: enough
// for the checks to see a backward that ignores eps. The norms curve sharply in x at that
// scale, so the FD step for x is smaller than the default (measured: FD error up to ~1e-6 at
// h = 1e-5, ~1e-9 at 1e-7); w and z keep the default step, where rounding stays smaller.
constexpr double kSmallRowScale = 1e-2, kFdStepX = 1e-7;
std::vector<double> random_rows(Rng& rng) {
  auto x = random_vec<double>(rng, kRows * kDim);
  for (int64_t i = 0; i < kDim; ++i) x[kDim + i] *= kSmallRowScale;
  return x;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Plain double references, straight from the definitions in norms.h.
std::vector<double> rmsnorm_reference(const std::vector<double>& x, const std::vector<double>& w,
                                      const std::vector<double>* z) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < kRows; ++r) {
    double ms = 0;
    for (int64_t i = 0; i < kDim; ++i) ms += x[r * kDim + i] * x[r * kDim + i] / kDim;
    for (int64_t i = 0; i < kDim; ++i) {
      const int64_t k = r * kDim + i;
      y[k] = x[k] / std::sqrt(ms + kRmsEps) * w[i] * (z ? silu((*z)[k]) : 1.0);
    }
  }
  return y;
}

std::vector<double> l2norm_reference(const std::vector<double>& x) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < kRows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < kDim; ++i) ss += x[r * kDim + i] * x[r * kDim + i];
    for (int64_t i = 0; i < kDim; ++i) y[r * kDim + i] = x[r * kDim + i] / std::sqrt(ss + kL2Eps);
  }
  return y;
}

// One random problem for all three norms; run<T>() fills y and the gradients of
// L = <y, dy> for the chosen norm in precision T.
enum class Norm { rms, gated_rms, l2 };

struct NormCase {
  Norm norm;
  std::vector<double> x, z, w, dy;
  std::vector<double> w_grad_base;  // dw starts here: the kernels accumulate into it
  NormCase(Norm n, Rng& rng)
      : norm(n), x(random_rows(rng)), z(random_vec<double>(rng, kRows * kDim, 2.0)),
        w(random_vec<double>(rng, kDim)), dy(random_vec<double>(rng, kRows * kDim)),
        w_grad_base(random_vec<double>(rng, kDim)) {}

  template <class T>
  struct Result {
    std::vector<T> y, dx, dz, dw;
  };

  template <class T>
  Result<T> run() const {
    auto xT = as<T>(x), zT = as<T>(z), wT = as<T>(w), dyT = as<T>(dy);
    Result<T> r{std::vector<T>(x.size(), T(NAN)), std::vector<T>(x.size(), T(NAN)),
                std::vector<T>(x.size(), T(NAN)), as<T>(w_grad_base)};
    std::vector<T> rstd(kRows, T(NAN));
    switch (norm) {
      case Norm::rms:
        rmsnorm_forward<T>(xT.data(), wT.data(), r.y.data(), rstd.data(), kRows, kDim, kRmsEps);
        rmsnorm_backward<T>(xT.data(), wT.data(), rstd.data(), dyT.data(), r.dx.data(), r.dw.data(), kRows, kDim);
        break;
      case Norm::gated_rms:
        gated_rmsnorm_forward<T>(xT.data(), zT.data(), wT.data(), r.y.data(), rstd.data(), kRows, kDim, kRmsEps);
        gated_rmsnorm_backward<T>(xT.data(), zT.data(), wT.data(), rstd.data(), dyT.data(), r.dx.data(),
                                  r.dz.data(), r.dw.data(), kRows, kDim);
        break;
      case Norm::l2:
        l2norm_forward<T>(xT.data(), r.y.data(), rstd.data(), kRows, kDim, kL2Eps);
        l2norm_backward<T>(r.y.data(), rstd.data(), dyT.data(), r.dx.data(), kRows, kDim);
        break;
    }
    for (int64_t i = 0; i < kDim; ++i) r.dw[i] -= T(w_grad_base[i]);
    return r;
  }

  std::vector<double> reference_y() const {
    if (norm == Norm::l2) return l2norm_reference(x);
    return rmsnorm_reference(x, w, norm == Norm::gated_rms ? &z : nullptr);
  }
};

const char* name(Norm n) { return n == Norm::rms ? "rmsnorm" : n == Norm::gated_rms ? "gated_rmsnorm" : "l2norm"; }

TEST(Norms, ForwardMatchesReference) {
  for (Norm n : {Norm::rms, Norm::gated_rms, Norm::l2}) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(std::string(name(n)) + " seed " + std::to_string(seed));
    Rng rng(seed);
    NormCase c(n, rng);
    const auto ref = c.reference_y();
    EXPECT_LE(rel_err(c.run<double>().y, ref), 1e-14);
    EXPECT_LE(rel_err(c.run<float>().y, ref), 1e-6);
  }
}

TEST(Norms, BackwardMatchesFiniteDifferences) {
  for (Norm n : {Norm::rms, Norm::gated_rms, Norm::l2}) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(std::string(name(n)) + " seed " + std::to_string(seed));
    Rng rng(seed);
    NormCase c(n, rng);
    const auto g = c.run<double>();
    auto loss = [&] { return dot(c.run<double>().y, c.dy); };
    EXPECT_LE(fd_error(loss, &c.x, g.dx, rng, kFdStepX), 1e-7) << "dx";
    if (n != Norm::l2) {
      EXPECT_LE(fd_error(loss, &c.w, g.dw, rng), 1e-7) << "dw";
    }
    if (n == Norm::gated_rms) {
      EXPECT_LE(fd_error(loss, &c.z, g.dz, rng), 1e-7) << "dz";
    }
  }
}

TEST(Norms, FloatBackwardMatchesDouble) {
  for (Norm n : {Norm::rms, Norm::gated_rms, Norm::l2}) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(std::string(name(n)) + " seed " + std::to_string(seed));
    Rng rng(seed);
    NormCase c(n, rng);
    const auto d = c.run<double>();
    const auto f = c.run<float>();
    EXPECT_LE(rel_err(f.dx, d.dx), 1e-5) << "dx";
    if (n != Norm::l2) {
      EXPECT_LE(rel_err(f.dw, d.dw), 1e-5) << "dw";
    }
    if (n == Norm::gated_rms) {
      EXPECT_LE(rel_err(f.dz, d.dz), 1e-5) << "dz";
    }
  }
}

}  // namespace
