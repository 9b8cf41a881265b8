// GDN gates on the GPU: the per-head parameter gradients over chunks cut at multiples of 64
// tokens equal the unsplit run's bitwise. The kernels against their float64 reference (head
// counts that do and do not divide the block, accumulating parameter gradients, bitwise
// repeats) are their op's test (mixers/gdn/gdn_gates_op.cpp, tests/cuda/test_op_defs_cuda.cpp).
#include <gtest/gtest.h>


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
