// fill_normal draws big tensors in parallel pieces: every value, and the stream's state after,
// are those of one loop of Rng::normal over the tensor (the values drawn before the pieces
// came), for sizes below, at and past a piece, pinned for a fixed seed, and the same on one thread.
#include <gtest/gtest.h>

#include <cstring>

#include "core/parallel.h"
#include "core/rng.h"
#include "model/param.h"
#include "test_util.h"

using namespace stateflow;

namespace {

template <class T>
std::vector<T> one_loop(Rng& rng, int64_t n, double std) {
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(std * rng.normal());
  return v;
}

// FNV-1a of a tensor's bytes.
uint64_t fnv(const Tensor& t) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = static_cast<const unsigned char*>(t.raw());
  for (int64_t i = 0; i < t.nbytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

}  // namespace

TEST(FillNormal, ValuesAreThoseOfOneLoopOverTheStream) {
  const uint64_t seed = stateflow::testing::fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t piece = int64_t(1) << 20;
  for (int64_t n : {int64_t(1), int64_t(1000), piece, piece + 1, 3 * piece + 12345}) {
    SCOPED_TRACE(n);
    Tensor f32 = Tensor::zeros({n}, DType::F32, MemCategory::Weights);
    Tensor f64 = Tensor::zeros({n}, DType::F64, MemCategory::Weights);
    Rng rng(seed), ref(seed);
    fill_normal(f32, rng, 0.02);
    fill_normal(f64, rng, 3.0);
    const std::vector<float> want32 = one_loop<float>(ref, n, 0.02);
    const std::vector<double> want64 = one_loop<double>(ref, n, 3.0);
    EXPECT_EQ(std::vector<float>(f32.data<float>(), f32.data<float>() + n), want32);
    EXPECT_EQ(std::vector<double>(f64.data<double>(), f64.data<double>() + n), want64);
    EXPECT_EQ(rng.state(), ref.state());
  }
}

// Hashes of the values the sequential fill_normal drew before it was cut into pieces.
TEST(FillNormal, PinnedForAFixedSeed) {
  const int64_t n = 3 * (int64_t(1) << 20) + 12345;
  for (auto [type, hash] : {std::pair{DType::F32, 2777544820125039922ull}, std::pair{DType::F64, 17541414576054971451ull}}) {
    Tensor t = Tensor::zeros({n}, type, MemCategory::Weights);
    Rng rng(42);
    fill_normal(t, rng, 0.02);
    EXPECT_EQ(fnv(t), hash) << dtype_name(type);
    EXPECT_EQ(rng.next_u64(), 4151359445389704600ull) << dtype_name(type);
  }
}

// model_build_bench --draw-threads 1 times this: the pieces drawn one after another on the
// caller's thread give the same values.
TEST(FillNormal, ValuesDoNotDependOnTheDrawThreads) {
  const uint64_t seed = stateflow::testing::fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t n = 2 * (int64_t(1) << 20) + 777;
  Tensor pieces = Tensor::zeros({n}, DType::F32, MemCategory::Weights), one = Tensor::zeros({n}, DType::F32, MemCategory::Weights);
  Rng a(seed), b(seed);
  fill_normal(pieces, a, 0.02);
  set_parallel_for_max_threads(1);
  fill_normal(one, b, 0.02);
  set_parallel_for_max_threads(0);
  EXPECT_EQ(std::memcmp(pieces.raw(), one.raw(), pieces.nbytes()), 0);
  EXPECT_EQ(a.state(), b.state());
}
