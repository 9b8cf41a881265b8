// The gradient-norm reduction on the GPU: the sum of squares over many arrays (empty, short,
// and longer than one pass of the grid) against an extended-precision host sum, and the same
// bits on every call. The residual add 8 values a thread (add_vectors) against one a thread.
#include <gtest/gtest.h>

#include <cstring>

#include "cuda_test_util.h"
#include "kernels/cuda/elementwise_cuda.h"
#include "test_util.h"

namespace stateflow {
namespace {

using namespace testing;

TEST(SumSquaresCuda, ManyArraysGiveTheExactSumEveryTime) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  // 67'584 = one pass of the 264 x 256 grid; scales far apart, as grads of different layers are.
  const std::vector<size_t> sizes = {0, 1, 7, 67'584, 67'584 + 3, 300'001, 1 << 20};
  std::vector<Dev<float>> arrays;
  std::vector<DeviceFloats> xs;
  long double reference = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    const Vec h = rounded<float>(normal_vec(rng, sizes[k], std::pow(10.0, double(k % 4) - 2)));
    for (double x : h) reference += (long double)x * x;
    arrays.emplace_back(h);  // moving a Dev keeps its device pointer, so xs stays valid
    xs.push_back({arrays.back().p, int64_t(sizes[k])});
  }

  const double first = sum_squares_cuda(xs, nullptr);
  EXPECT_LE(std::abs(first - double(reference)), 1e-12 * double(reference)) << first << " vs " << double(reference);
  for (int run = 0; run < 3; ++run) {
    const double again = sum_squares_cuda(xs, nullptr);
    EXPECT_EQ(std::memcmp(&again, &first, sizeof first), 0) << "run " << run << ": " << again << " vs " << first;
  }
  EXPECT_EQ(sum_squares_cuda({}, nullptr), 0.0);
  EXPECT_EQ(sum_squares_cuda({{arrays[0].p, 0}}, nullptr), 0.0);
}

// y += x with 8 values a thread (add_vectors) gives the bits of one a thread: a 1K-token chunk of
// 2048-wide rows, a length no vector divides (the tail), and arrays off 16 bytes (one a thread
// either way); against the float64 sum rounded once as well.
template <class A>
void check_add_vectors(Rng& rng, int64_t n, int64_t offset) {
  SCOPED_TRACE("n " + std::to_string(n) + ", offset " + std::to_string(offset));
  const Vec y0 = normal_vec(rng, n + offset), x = normal_vec(rng, n + offset);
  Dev<A> d_x(x), d_vec(y0), d_one(y0);
  for (bool vectors : {true, false}) {
    FlagScope scope(add_vectors_for_thread(), vectors);
    add_inplace_cuda<A>((vectors ? d_vec.p : d_one.p) + offset, d_x.p + offset, n, nullptr);
  }
  sync_ok();
  EXPECT_TRUE(bitwise_equal(d_vec.raw(), d_one.raw()));
  const std::vector<A> got = d_vec.raw(), y_stored = Dev<A>(y0).raw(), x_stored = d_x.raw();
  for (int64_t i = offset; i < n + offset; i += 997) {
    const float want = float(A(float(y_stored[i]) + float(x_stored[i])));
    ASSERT_EQ(float(got[i]), want) << "element " << i;
  }
}

TEST(AddInplaceCuda, EightValuesAThreadGiveTheBitsOfOne) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (const auto& [n, offset] : {std::pair<int64_t, int64_t>{1024 * 2048, 0}, {1001, 0}, {4096, 1}}) {
    check_add_vectors<float>(rng, n, offset);
    check_add_vectors<bf16>(rng, n, offset);
  }
}

}  // namespace
}  // namespace stateflow
