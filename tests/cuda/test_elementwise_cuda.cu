// The gradient-norm reduction on the GPU: the sum of squares over many arrays (empty, short,
// and longer than one pass of the grid) against an extended-precision host sum, and the same
// bits on every call.
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

}  // namespace
}  // namespace stateflow
