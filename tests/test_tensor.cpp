// Tensor dtype/device basics: bf16 bits round to nearest even (checked against a rounding
// done in double arithmetic), cast round-trips, and device tensors without a registered
// backend fail with an error naming the fix (this binary never registers one).
#include <gtest/gtest.h>

#include <cmath>

#include "core/rng.h"
#include "core/tensor.h"
#include "test_util.h"

namespace stateflow {
namespace {

using testing::fresh_seed;

// bf16 keeps 8 significant bits: round x to the nearest multiple of 2^(e-7), ties to even.
double bf16_reference(double x) {
  if (x == 0) return x;
  int e;
  std::frexp(x, &e);  // x = m 2^e, 0.5 <= |m| < 1
  const double ulp = std::ldexp(1.0, e - 8);
  return std::nearbyint(x / ulp) * ulp;  // default rounding mode: to nearest even
}

TEST(Tensor, Bf16RoundsToNearestEven) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (int i = 0; i < 5000; ++i) {
    const float x = static_cast<float>(rng.normal() * std::exp(4 * rng.normal()));
    ASSERT_EQ(float_from_bf16(bf16_from_float(x)), static_cast<float>(bf16_reference(x))) << x;
  }
  // An exact tie goes to the even neighbour: 1 + 2^-8 sits between 1 and 1 + 2^-7.
  EXPECT_EQ(float_from_bf16(bf16_from_float(1.0f + 0x1p-8f)), 1.0f);
  EXPECT_EQ(float_from_bf16(bf16_from_float(1.0f + 3 * 0x1p-8f)), 1.0f + 0x1p-6f);
  EXPECT_TRUE(std::isnan(float_from_bf16(bf16_from_float(NAN))));
  EXPECT_EQ(float_from_bf16(bf16_from_float(INFINITY)), INFINITY);
}

TEST(Tensor, CastToBf16AndBack) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  Tensor x = Tensor::zeros({7, 5}, DType::F64);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<double>()[i] = rng.normal();
  Tensor b = x.cast(DType::BF16);
  EXPECT_EQ(b.dtype(), DType::BF16);
  EXPECT_EQ(b.nbytes(), size_t(7 * 5 * 2));
  Tensor back = b.cast(DType::F32);
  for (int64_t i = 0; i < x.numel(); ++i)
    ASSERT_EQ(back.data<float>()[i], static_cast<float>(bf16_reference(float(x.data<double>()[i]))));
  EXPECT_LE(max_rel_diff(back.cast(DType::F64), x), 1.0 / 256);
  EXPECT_THROW(b.data<float>(), Error);
  EXPECT_THROW(Tensor::zeros({2}, DType::I32).cast(DType::BF16), Error);
}

// A tensor past one piece (2^20 elements) is cast in parallel pieces: every element as alone.
TEST(Tensor, BigCastsConvertEveryElementAsASmallOneDoes) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t n = 2 * (int64_t(1) << 20) + 777;
  Tensor x = Tensor::zeros({n}, DType::F32);
  for (int64_t i = 0; i < n; ++i) x.data<float>()[i] = static_cast<float>(rng.normal() * std::exp(4 * rng.normal()));
  const Tensor b = x.cast(DType::BF16), d = x.cast(DType::F64);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(b.data<BF16>()[i].bits, bf16_from_float(x.data<float>()[i]).bits) << i;
    ASSERT_EQ(d.data<double>()[i], double(x.data<float>()[i])) << i;
  }
}

TEST(Tensor, HostTensorsStayOnTheHost) {
  Tensor x = Tensor::zeros({3}, DType::F32, MemCategory::Other);
  EXPECT_EQ(x.device(), Device::CPU);
  EXPECT_EQ(x.clone().device(), Device::CPU);
  x.data<float>()[1] = 2.5f;
  Tensor y = x.to(Device::CPU);
  x.data<float>()[1] = 0;
  EXPECT_EQ(y.data<float>()[1], 2.5f) << "to() copies even to the same device";
  EXPECT_EQ(parse_device("cuda"), Device::CUDA);
  EXPECT_THROW(parse_device("tpu"), Error);
}

TEST(Tensor, DeviceTensorWithoutBackendNamesTheFix) {
  if (device_available(Device::CUDA)) GTEST_SKIP() << "a CUDA backend is registered in this process";
  try {
    Tensor::zeros({4}, DType::F32, MemCategory::Other, Device::CUDA);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("init_cuda_backend"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace stateflow
