#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "mixers/gdn/gdn_gates.h"
#include "kernel_test_util.h"

using namespace stateflow;
using namespace stateflow::testing;

namespace {

constexpr int64_t kRows = 3 * 8, kHeads = 4, kN = kRows * kHeads;  // batch 3, len 8

// Gate inputs as a layer sees them, plus cotangents for L = <g, dg> + <beta, dbeta>.
struct GatesCase {
  std::vector<double> a, b, A_log, dt_bias, dg, dbeta;
  std::vector<double> dA_log_base, ddt_bias_base;  // the kernel accumulates into these
  explicit GatesCase(Rng& rng)
      : a(random_vec<double>(rng, kN, 2.0)), b(random_vec<double>(rng, kN, 2.0)), A_log(kHeads), dt_bias(kHeads),
        dg(random_vec<double>(rng, kN)), dbeta(random_vec<double>(rng, kN)),
        dA_log_base(random_vec<double>(rng, kHeads)), ddt_bias_base(random_vec<double>(rng, kHeads)) {
    for (int64_t h = 0; h < kHeads; ++h) {
      A_log[h] = std::log(rng.uniform(1.0, 16.0));  // fla's init range for A
      dt_bias[h] = rng.normal();
    }
    a[3] = 25.0;  // exercise softplus's large-argument branch
  }

  template <class T>
  struct Result {
    std::vector<T> g, beta, da, db, dA_log, ddt_bias;
  };

  template <class T>
  Result<T> run() const {
    auto aT = as<T>(a), bT = as<T>(b), AT = as<T>(A_log), dtT = as<T>(dt_bias), dgT = as<T>(dg),
         dbT = as<T>(dbeta);
    Result<T> r{std::vector<T>(kN), std::vector<T>(kN),       std::vector<T>(kN, T(NAN)),
                std::vector<T>(kN, T(NAN)), as<T>(dA_log_base), as<T>(ddt_bias_base)};
    gdn_gates_forward<T>(aT.data(), bT.data(), AT.data(), dtT.data(), r.g.data(), r.beta.data(), kRows, kHeads);
    gdn_gates_backward<T>(aT.data(), bT.data(), AT.data(), dtT.data(), dgT.data(), dbT.data(), r.da.data(),
                          r.db.data(), r.dA_log.data(), r.ddt_bias.data(), kRows, kHeads);
    for (int64_t h = 0; h < kHeads; ++h) {
      r.dA_log[h] -= T(dA_log_base[h]);
      r.ddt_bias[h] -= T(ddt_bias_base[h]);
    }
    return r;
  }

  double loss() const {
    const auto r = run<double>();
    double l = 0;
    for (int64_t i = 0; i < kN; ++i) l += r.g[i] * dg[i] + r.beta[i] * dbeta[i];
    return l;
  }
};

TEST(GdnGates, ForwardMatchesReference) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  GatesCase c(rng);
  std::vector<double> g(kN), beta(kN);
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t h = 0; h < kHeads; ++h) {
      const int64_t i = r * kHeads + h;
      beta[i] = 1 / (1 + std::exp(-c.b[i]));
      g[i] = -std::exp(c.A_log[h]) * std::log(1 + std::exp(c.a[i] + c.dt_bias[h]));
    }
  const auto d = c.run<double>();
  const auto f = c.run<float>();
  // softplus in activations.h returns x itself above 20, off by log1p(e^-x) (< 1e-10 relative).
  EXPECT_LE(rel_err(d.g, g), 1e-10);
  EXPECT_LE(rel_err(d.beta, beta), 1e-15);
  EXPECT_LE(rel_err(f.g, g), 1e-6);
  EXPECT_LE(rel_err(f.beta, beta), 1e-6);
  for (double gi : d.g) EXPECT_LE(gi, 0.0);  // log-decay: alpha = exp(g) in (0, 1]
}

TEST(GdnGates, BackwardMatchesFiniteDifferences) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  GatesCase c(rng);
  const auto r = c.run<double>();
  auto loss = [&] { return c.loss(); };
  EXPECT_LE(fd_error(loss, &c.a, r.da, rng), 1e-7) << "da";
  EXPECT_LE(fd_error(loss, &c.b, r.db, rng), 1e-7) << "db";
  EXPECT_LE(fd_error(loss, &c.A_log, r.dA_log, rng), 1e-7) << "dA_log";
  EXPECT_LE(fd_error(loss, &c.dt_bias, r.ddt_bias, rng), 1e-7) << "ddt_bias";
}

TEST(GdnGates, FloatBackwardMatchesDouble) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  GatesCase c(rng);
  const auto d = c.run<double>();
  const auto f = c.run<float>();
  EXPECT_LE(rel_err(f.da, d.da), 1e-6);
  EXPECT_LE(rel_err(f.db, d.db), 1e-6);
  EXPECT_LE(rel_err(f.dA_log, d.dA_log), 1e-5);
  EXPECT_LE(rel_err(f.ddt_bias, d.ddt_bias), 1e-5);
}

}  // namespace
