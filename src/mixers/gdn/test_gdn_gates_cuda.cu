// GDN gates on the GPU against kernels/cpu/gdn_gates in float64 on the same rounded inputs,
// for head counts that do and do not divide the block, more rows than partial blocks; the
// per-head parameter gradients accumulate onto existing values and are bitwise repeatable.
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>

#include "mixers/gdn/gdn_gates.h"
#include "mixers/gdn/gdn_gates_cuda.h"
#include "cuda_test_util.h"
#include "test_util.h"

namespace stateflow {
namespace {

using namespace testing;

template <class A>
class GdnGatesCuda : public ::testing::Test {};
using ActTypes = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(GdnGatesCuda, ActTypes);

TYPED_TEST(GdnGatesCuda, MatchesCpuAndIsRepeatable) {
  SKIP_WITHOUT_GPU();
  using A = TypeParam;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (const auto& shape : {std::tuple<int64_t, int64_t, int64_t>{2500, 16, 2}, {77, 3, 1}}) {
    const int64_t rows = std::get<0>(shape), heads = std::get<1>(shape), batch = std::get<2>(shape);
    SCOPED_TRACE("rows " + std::to_string(rows) + " heads " + std::to_string(heads));
    const int64_t n = rows * heads;
    const Vec a = rounded<A>(normal_vec(rng, n, 2.0)), b = rounded<A>(normal_vec(rng, n, 2.0));
    const Vec dg = rounded<float>(normal_vec(rng, n)), dbeta = rounded<float>(normal_vec(rng, n));
    Vec A_log(heads), dt_bias(heads);
    for (int64_t h = 0; h < heads; ++h)
      A_log[h] = round_to<float>(std::log(rng.uniform(1, 16))),
      dt_bias[h] = round_to<float>(std::log(std::expm1(rng.uniform(0.001, 0.1))));
    const Vec dA0 = rounded<float>(normal_vec(rng, heads)), ddt0 = rounded<float>(normal_vec(rng, heads));
    Dev<A> d_a(a), d_b(b), d_da(n), d_db(n);
    Dev<float> d_Alog(A_log), d_dt(dt_bias), d_dg(dg), d_dbeta(dbeta), d_g(n), d_beta(n);
    Dev<char> ws(gdn_gates_backward_workspace_bytes(rows, heads, batch));
    auto run = [&] {
      for (auto* d : {&d_da, &d_db}) d->poison();
      for (auto* d : {&d_g, &d_beta}) d->poison();
      Dev<float> d_dA(dA0), d_ddt(ddt0);
      gdn_gates_forward_cuda<A>(d_a.p, d_b.p, d_Alog.p, d_dt.p, d_g.p, d_beta.p, rows, heads, nullptr);
      gdn_gates_backward_cuda<A>(d_a.p, d_b.p, d_Alog.p, d_dt.p, d_dg.p, d_dbeta.p, d_da.p, d_db.p, d_dA.p, d_ddt.p,
                                 rows, heads, batch, ws.p, nullptr);
      sync_ok();
      return std::pair{d_dA.raw(), d_ddt.raw()};
    };
    const auto [dA_raw, ddt_raw] = run();
    Vec g(n), beta(n), da(n), db(n), dA = dA0, ddt = ddt0;
    gdn_gates_forward<double>(a.data(), b.data(), A_log.data(), dt_bias.data(), g.data(), beta.data(), rows, heads);
    gdn_gates_backward<double>(a.data(), b.data(), A_log.data(), dt_bias.data(), dg.data(), dbeta.data(), da.data(),
                               db.data(), dA.data(), ddt.data(), rows, heads);
    const Vec dA_gpu(dA_raw.begin(), dA_raw.end()), ddt_gpu(ddt_raw.begin(), ddt_raw.end());
    for (auto [name, got, ref, tol] :
         {std::tuple{"g", d_g.get(), g, tolerance<float>()}, {"beta", d_beta.get(), beta, tolerance<float>()},
          {"da", d_da.get(), da, tolerance<A>()}, {"db", d_db.get(), db, tolerance<A>()},
          {"dA_log", dA_gpu, dA, tolerance<float>()}, {"ddt_bias", ddt_gpu, ddt, tolerance<float>()}}) {
      EXPECT_FALSE(has_nan(got)) << name;
      EXPECT_LE(rel_err(got, ref), tol) << name << " rel err " << rel_err(got, ref);
    }
    const auto [dA_again, ddt_again] = run();
    EXPECT_TRUE(bitwise_equal(dA_raw, dA_again) && bitwise_equal(ddt_raw, ddt_again)) << "not repeatable";
  }
}

// dA_log and ddt_bias over chunks cut at multiples of 64 tokens, run last chunk first, equal
// the unsplit run's bitwise.
TYPED_TEST(GdnGatesCuda, ChunksAtMultiplesOf64GiveTheUnsplitParameterGradientsBitwise) {
  SKIP_WITHOUT_GPU();
  using A = TypeParam;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t batch = 2, len = 512, heads = 4, n = batch * len * heads;
  const Vec a = normal_vec(rng, n), b = normal_vec(rng, n), dg = normal_vec(rng, n), dbeta = normal_vec(rng, n);
  const Vec A_log = normal_vec(rng, heads, 0.5), dt_bias = normal_vec(rng, heads, 0.5);
  const Vec dA0 = normal_vec(rng, heads), ddt0 = normal_vec(rng, heads);
  auto rows_of = [&](const Vec& v, int64_t t0, int64_t t1) {
    Vec out;
    for (int64_t s = 0; s < batch; ++s)
      out.insert(out.end(), v.begin() + (s * len + t0) * heads, v.begin() + (s * len + t1) * heads);
    return out;
  };
  auto run = [&](const std::vector<int64_t>& cuts) {
    Dev<float> d_Alog(A_log), d_dt(dt_bias), d_dA(dA0), d_ddt(ddt0);
    for (size_t c = cuts.size() - 1; c-- > 0;) {
      const int64_t t0 = cuts[c], t1 = cuts[c + 1], rows = batch * (t1 - t0);
      Dev<A> d_a(rows_of(a, t0, t1)), d_b(rows_of(b, t0, t1)), d_da(size_t(rows * heads)), d_db(size_t(rows * heads));
      Dev<float> d_dg(rows_of(dg, t0, t1)), d_dbeta(rows_of(dbeta, t0, t1));
      Dev<char> ws(gdn_gates_backward_workspace_bytes(rows, heads, batch));
      gdn_gates_backward_cuda<A>(d_a.p, d_b.p, d_Alog.p, d_dt.p, d_dg.p, d_dbeta.p, d_da.p, d_db.p, d_dA.p, d_ddt.p,
                                 rows, heads, batch, ws.p, nullptr);
      sync_ok();
    }
    return std::pair{d_dA.raw(), d_ddt.raw()};
  };
  const auto whole = run({0, len});
  for (const std::vector<int64_t>& cuts : {std::vector<int64_t>{0, 256, len}, std::vector<int64_t>{0, 128, 448, len}}) {
    const auto split = run(cuts);
    EXPECT_TRUE(bitwise_equal(split.first, whole.first)) << "dA_log, " << cuts.size() - 1 << " chunks";
    EXPECT_TRUE(bitwise_equal(split.second, whole.second)) << "ddt_bias, " << cuts.size() - 1 << " chunks";
  }
}

}  // namespace
}  // namespace stateflow
