// SwiGLU on the GPU with a and b (and da, db) as column blocks of one [rows, ld] matrix (the MLP's
// x W1 and x W3 as one GEMM's output, lever fused_proj): the bits of contiguous tensors, columns
// outside the blocks left alone. The kernel against its float64 reference is its op's test
// (kernels/ops/swiglu_op.cpp, tests/cuda/test_op_defs_cuda.cpp).
#include <gtest/gtest.h>

#include "kernels/cuda/swiglu_cuda.h"
#include "cuda_test_util.h"
#include "test_util.h"

namespace stateflow {
namespace {

using namespace testing;

template <class A>
class SwigluCuda : public ::testing::Test {};
using ActTypes = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(SwigluCuda, ActTypes);

TYPED_TEST(SwigluCuda, ColumnBlocksGiveTheContiguousBits) {
  SKIP_WITHOUT_GPU();
  using A = TypeParam;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t rows = 37, F = 136, ld = 2 * F + 8, n = rows * F;  // a, then b, then 8 columns of neither
  const Vec a = normal_vec(rng, n), b = normal_vec(rng, n), dh = normal_vec(rng, n);
  const size_t values = static_cast<size_t>(n);
  Dev<A> d_a(a), d_b(b), d_dh(dh), h(values), da(values), db(values);
  h.poison(), da.poison(), db.poison();
  swiglu_forward_cuda<A>(d_a.p, d_b.p, h.p, n, nullptr);
  swiglu_backward_cuda<A>(d_a.p, d_b.p, d_dh.p, da.p, db.p, n, nullptr);

  Vec ab(size_t(rows * ld), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < F; ++c) ab[r * ld + c] = a[r * F + c], ab[r * ld + F + c] = b[r * F + c];
  Dev<A> d_ab(ab), h_wide(values), dab(ab.size());
  h_wide.poison(), dab.poison();
  swiglu_forward_cuda<A>(d_ab.p, d_ab.p + F, h_wide.p, n, nullptr, F, ld);
  swiglu_backward_cuda<A>(d_ab.p, d_ab.p + F, d_dh.p, dab.p, dab.p + F, n, nullptr, F, ld);
  sync_ok();
  EXPECT_TRUE(bitwise_equal(h_wide.raw(), h.raw())) << "h";
  const std::vector<A> wide = dab.raw(), da_c = da.raw(), db_c = db.raw();
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_TRUE(bitwise_equal(std::vector<A>(wide.begin() + r * ld, wide.begin() + r * ld + F),
                              std::vector<A>(da_c.begin() + r * F, da_c.begin() + (r + 1) * F)))
        << "da, row " << r;
    EXPECT_TRUE(bitwise_equal(std::vector<A>(wide.begin() + r * ld + F, wide.begin() + r * ld + 2 * F),
                              std::vector<A>(db_c.begin() + r * F, db_c.begin() + (r + 1) * F)))
        << "db, row " << r;
    EXPECT_TRUE(std::isnan(float(wide[size_t(r * ld + ld - 1)]))) << "row " << r;
  }
}

TEST(SwigluCudaChecks, RejectsColumnBlocksThatDoNotTile) {
  // 100 columns are not whole 8-wide vectors; 96 do not tile 100 values
  expect_error([] { swiglu_forward_cuda<float>(nullptr, nullptr, nullptr, 200, nullptr, 100, 208); }, "multiples of 8");
  expect_error([] { swiglu_forward_cuda<float>(nullptr, nullptr, nullptr, 100, nullptr, 96, 200); }, "tile n = 100");
}

}  // namespace
}  // namespace stateflow
