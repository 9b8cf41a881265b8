// Device tensors through the CUDA backend: host -> device -> host is bitwise, new device
// tensors are zero, clone/copy_from/zero_ work on and across devices, and device bytes are
// charged to the thread's tracker and category and given back when the last copy goes.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "core/rng.h"
#include "core/tensor.h"
#include "kernels/cuda/cuda_backend.h"
#include "cuda_test_util.h"
#include "test_util.h"

namespace stateflow {
namespace {

using testing::fresh_seed;

Tensor random_host(const Shape& s, Rng& rng) {
  Tensor t = Tensor::zeros(s, DType::F32, MemCategory::Other);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(rng.normal());
  return t;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Outputs that skip the zero-fill (Tensor::uninitialized) are all-ones bytes, NaN in every
// float type, in the tests (poison_uninitialized.cpp); zeros() are still zero.
TEST(CudaBackend, UninitializedTensorsArePoisonedInTestsAndZerosAreZero) {
  SKIP_WITHOUT_GPU();
  init_cuda_backend();
  for (DType t : {DType::F32, DType::BF16}) {
    const Tensor u = Tensor::uninitialized({3, 37}, t, MemCategory::Other, Device::CUDA).to(Device::CPU);
    const Tensor z = Tensor::zeros({3, 37}, t, MemCategory::Other, Device::CUDA).to(Device::CPU);
    const auto* ub = static_cast<const unsigned char*>(u.raw());
    const auto* zb = static_cast<const unsigned char*>(z.raw());
    for (size_t i = 0; i < u.nbytes(); ++i) ASSERT_TRUE(ub[i] == 0xff && zb[i] == 0) << dtype_name(t) << " byte " << i;
  }
}

// DeviceClock::hold stops the stream until release(): marks queued around a host pause while
// held show the pause; marks queued while held and run after the release show none of it.
TEST(CudaBackend, ClockHoldStopsTheStreamUntilRelease) {
  SKIP_WITHOUT_GPU();
  init_cuda_backend();
  auto clock = device_backend(Device::CUDA).make_clock();
  const int before = clock->mark();
  clock->hold();
  const int held_from = clock->mark();
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  const int held_to = clock->mark();
  clock->release();
  EXPECT_GE(clock->seconds_between(before, held_from), 0.025);  // the hold lasted the pause
  EXPECT_LT(clock->seconds_between(held_from, held_to), 0.005);  // queued work ran back to back
  EXPECT_FALSE(clock->hold_timed_out());
}

TEST(CudaBackend, RoundTripAndCopiesAreBitwise) {
  SKIP_WITHOUT_GPU();
  init_cuda_backend();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const Tensor x = random_host({1 + int64_t(rng.below(50)), 1 + int64_t(rng.below(300))}, rng);
  Tensor d = x.to(Device::CUDA);
  EXPECT_EQ(d.device(), Device::CUDA);
  EXPECT_TRUE(bitwise_equal(d.to(Device::CPU), x));
  Tensor d2 = d.clone();
  EXPECT_EQ(d2.device(), Device::CUDA);
  d.zero_();
  EXPECT_TRUE(bitwise_equal(d2.to(Device::CPU), x)) << "clone is a separate copy";
  EXPECT_EQ(max_rel_diff(d.to(Device::CPU), Tensor::zeros_like(x)), 0.0);
  d.copy_from(d2);  // device -> device
  Tensor h = Tensor::zeros_like(x);
  h.copy_from(d);  // device -> host
  EXPECT_TRUE(bitwise_equal(h, x));
  EXPECT_THROW(d.add_(d2), Error) << "host-only helpers refuse device tensors";
}

TEST(CudaBackend, NewDeviceTensorsAreZero) {
  SKIP_WITHOUT_GPU();
  init_cuda_backend();
  for (int rep = 0; rep < 3; ++rep) {
    // Reuses a cached block that held data before.
    Tensor dirty = Tensor::zeros({1000}, DType::F32, MemCategory::Other, Device::CUDA);
    Tensor ones = Tensor::zeros({1000}, DType::F32, MemCategory::Other);
    for (int i = 0; i < 1000; ++i) ones.data<float>()[i] = 1;
    dirty.copy_from(ones);
  }
  Tensor z = Tensor::zeros({1000}, DType::F32, MemCategory::Other, Device::CUDA).to(Device::CPU);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(z.data<float>()[i], 0.0f) << i;
}

TEST(CudaBackend, ChargesTheThreadsTrackerAndCategory) {
  SKIP_WITHOUT_GPU();
  init_cuda_backend();
  MemoryTracker tracker("gpu-test");
  TrackerScope scope(tracker);
  {
    Tensor w = Tensor::zeros({100, 10}, DType::BF16, MemCategory::Weights, Device::CUDA);
    Tensor a = Tensor::zeros({3}, DType::F32, MemCategory::Activations, Device::CUDA);
    Tensor a2 = a;  // shares the storage
    const MemorySnapshot s = tracker.snapshot();
    EXPECT_EQ(s.current_of(MemCategory::Weights), 2000);
    EXPECT_EQ(s.current_of(MemCategory::Activations), 12);
    EXPECT_EQ(cuda_allocator_for(tracker).stats().in_use,
              int64_t(DeviceAllocator::size_class(2000) + DeviceAllocator::size_class(12)));
  }
  EXPECT_EQ(tracker.snapshot().total_current, 0);
  EXPECT_EQ(tracker.snapshot().peak_of(MemCategory::Weights), 2000);
}

}  // namespace
}  // namespace stateflow
