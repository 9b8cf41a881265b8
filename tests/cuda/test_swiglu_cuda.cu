// SwiGLU on the GPU against kernels/cpu/swiglu in float64 on the same rounded inputs, with a
// length that leaves a tail past the 8-wide vectors; outputs poisoned first; backward runs
// bitwise repeatable.
#include <gtest/gtest.h>

#include "kernels/cpu/swiglu.h"
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

TYPED_TEST(SwigluCuda, MatchesCpuIncludingTheTail) {
  SKIP_WITHOUT_GPU();
  using A = TypeParam;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (int64_t n : {int64_t(7), int64_t(100003)}) {
    SCOPED_TRACE("n " + std::to_string(n));
    const Vec a = rounded<A>(normal_vec(rng, n, 3.0)), b = rounded<A>(normal_vec(rng, n));
    const Vec dh = rounded<A>(normal_vec(rng, n));
    Dev<A> d_a(a), d_b(b), d_dh(dh), d_h(n), d_da(n), d_db(n);
    for (auto* d : {&d_h, &d_da, &d_db}) d->poison();
    swiglu_forward_cuda<A>(d_a.p, d_b.p, d_h.p, n, nullptr);
    swiglu_backward_cuda<A>(d_a.p, d_b.p, d_dh.p, d_da.p, d_db.p, n, nullptr);
    sync_ok();
    Vec h(n), da(n), db(n);
    swiglu_forward<double>(a.data(), b.data(), h.data(), n);
    swiglu_backward<double>(a.data(), b.data(), dh.data(), da.data(), db.data(), n);
    for (auto [name, got, ref] : {std::tuple{"h", d_h.get(), h}, {"da", d_da.get(), da}, {"db", d_db.get(), db}}) {
      EXPECT_FALSE(has_nan(got)) << name;
      EXPECT_LE(rel_err(got, ref), tolerance<A>()) << name << " rel err " << rel_err(got, ref);
    }
    const auto da1 = d_da.raw(), db1 = d_db.raw();
    swiglu_backward_cuda<A>(d_a.p, d_b.p, d_dh.p, d_da.p, d_db.p, n, nullptr);
    sync_ok();
    EXPECT_TRUE(bitwise_equal(d_da.raw(), da1) && bitwise_equal(d_db.raw(), db1));
  }
}

}  // namespace
}  // namespace stateflow
