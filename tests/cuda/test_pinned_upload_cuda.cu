// upload_async: more uploads than staging slots, of growing and shrinking sizes, each from a
// host buffer overwritten and freed as soon as the call returns, behind a kernel that keeps the
// GPU busy; every device array must hold what its host buffer held at the call.
#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "kernels/cuda/pinned_upload_cuda.h"
#include "test_util.h"

namespace stateflow {
namespace {

using namespace testing;

__global__ void spin_kernel(int64_t cycles) {
  const int64_t start = clock64();
  while (clock64() - start < cycles) {
  }
}

TEST(PinnedUploadCuda, EveryUploadHoldsItsHostBytesAtTheCall) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  spin_kernel<<<1, 1>>>(int64_t(1) << 24);  // the uploads queue behind it
  std::vector<Dev<int32_t>> device;
  std::vector<std::vector<int32_t>> expected;
  for (int i = 0; i < 20; ++i) {
    const size_t n = 1 + rng.below(i % 5 == 4 ? 100'000 : 3'000);
    auto host = std::make_unique<std::vector<int32_t>>(n);
    for (int32_t& x : *host) x = int32_t(rng.below(1u << 30));
    expected.push_back(*host);
    device.emplace_back(n);
    upload_async(device.back().p, host->data(), n * sizeof(int32_t), nullptr);
    std::fill(host->begin(), host->end(), -1);  // the call must have taken its copy already
    host.reset();
  }
  sync_ok();
  for (size_t i = 0; i < device.size(); ++i) EXPECT_TRUE(bitwise_equal(device[i].raw(), expected[i])) << "upload " << i;
  upload_async(device[0].p, nullptr, 0, nullptr);  // nothing to copy: no call to the driver
  sync_ok();
}

}  // namespace
}  // namespace stateflow
