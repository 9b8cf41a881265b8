// grad_sq_sum over parameters whose grads live on the GPU (one wait for the device for all of
// them): within 1e-12 of an extended-precision host sum, equal to the CPU path's sum within
// the same band, and the same bits on every call.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "cuda_test_util.h"
#include "kernels/cuda/cuda_backend.h"
#include "test_util.h"
#include "model/optimizer.h"

namespace stateflow {
namespace {

using testing::fresh_seed;

TEST(OptimizerCuda, DeviceGradSqSumMatchesTheHostSumBitwiseEveryRun) {
  SKIP_WITHOUT_GPU();
  init_cuda_backend();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const std::vector<Shape> shapes = {{257, 131}, {1}, {512}, {3, 70'001}, {64, 64}};
  std::vector<Param> host, device;
  long double reference = 0;
  for (size_t k = 0; k < shapes.size(); ++k) {
    Param p = make_param(cat("p", k), shapes[k], DType::F32);
    const double scale = std::pow(10.0, double(k % 3) - 1);
    float* g = p.grad.data<float>();
    for (int64_t i = 0; i < p.grad.numel(); ++i) {
      g[i] = float(scale * rng.normal());
      reference += (long double)g[i] * g[i];
    }
    device.push_back(Param{p.name, p.value.to(Device::CUDA, MemCategory::Weights),
                           p.grad.to(Device::CUDA, MemCategory::Grads)});
    host.push_back(std::move(p));
  }
  std::vector<Param*> host_ptrs, device_ptrs;
  for (size_t k = 0; k < shapes.size(); ++k) host_ptrs.push_back(&host[k]), device_ptrs.push_back(&device[k]);

  const double ref = double(reference);
  const double on_gpu = grad_sq_sum(device_ptrs);
  EXPECT_LE(std::abs(on_gpu - ref), 1e-12 * ref) << on_gpu << " vs " << ref;
  EXPECT_LE(std::abs(on_gpu - grad_sq_sum(host_ptrs)), 1e-12 * ref);
  for (int run = 0; run < 3; ++run) {
    const double again = grad_sq_sum(device_ptrs);
    EXPECT_EQ(std::memcmp(&again, &on_gpu, sizeof on_gpu), 0) << "run " << run << ": " << again << " vs " << on_gpu;
  }
  EXPECT_NEAR(clip_grad_norm(device_ptrs, 0.0), std::sqrt(ref), 1e-12 * std::sqrt(ref));
}

}  // namespace
}  // namespace stateflow
