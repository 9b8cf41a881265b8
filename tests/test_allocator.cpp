// The memory accounting every published memory figure comes from: per-category current and
// peak bytes, the peak of the total, thread-local tracker and category scopes, aligned
// zeroed allocations, and the out-of-memory message.
#include <gtest/gtest.h>

#include <cstdint>
#include <thread>
#include <vector>

#include "core/allocator.h"
#include "core/tensor.h"
#include "test_util.h"

using namespace stateflow;
using namespace stateflow::testing;

TEST(Allocator, TracksCurrentAndPeakPerCategoryAndOfTheTotal) {
  MemoryTracker t("test");
  t.add(MemCategory::Weights, 100);
  t.add(MemCategory::Activations, 50);
  t.sub(MemCategory::Activations, 50);
  t.add(MemCategory::Activations, 30);
  MemorySnapshot s = t.snapshot();
  EXPECT_EQ(s.current_of(MemCategory::Weights), 100);
  EXPECT_EQ(s.current_of(MemCategory::Activations), 30);
  EXPECT_EQ(s.peak_of(MemCategory::Activations), 50);
  EXPECT_EQ(s.total_current, 130);
  EXPECT_EQ(s.total_peak, 150);  // weights 100 + activations 50, at once
  EXPECT_EQ(s.peak_of(MemCategory::Grads), 0);

  t.reset_peaks();  // a new window: peaks start from what is held now
  s = t.snapshot();
  EXPECT_EQ(s.peak_of(MemCategory::Activations), 30);
  EXPECT_EQ(s.total_peak, 130);
}

TEST(Allocator, ScopesChooseTrackerAndCategoryPerThreadAndNest) {
  MemoryTracker a("a"), b("b");
  {
    TrackerScope on_a(a);
    CategoryScope grads(MemCategory::Grads);
    Tensor x = Tensor::zeros({10}, DType::F64, current_category());  // 80 bytes
    {
      TrackerScope on_b(b);
      CategoryScope state(MemCategory::BoundaryState);
      EXPECT_EQ(&current_tracker(), &b);
      Tensor y = Tensor::zeros({3}, DType::F32, current_category());  // 12 bytes
      EXPECT_EQ(b.snapshot().current_of(MemCategory::BoundaryState), 12);
      // Another thread is not in these scopes.
      std::thread([&] {
        EXPECT_EQ(&current_tracker(), &default_tracker());
        EXPECT_EQ(current_category(), MemCategory::Other);
      }).join();
    }
    EXPECT_EQ(&current_tracker(), &a);  // restored on leaving the inner scopes
    EXPECT_EQ(current_category(), MemCategory::Grads);
    EXPECT_EQ(a.snapshot().current_of(MemCategory::Grads), 80);
    EXPECT_EQ(b.snapshot().current_of(MemCategory::BoundaryState), 0);  // y is gone
    EXPECT_EQ(b.snapshot().peak_of(MemCategory::BoundaryState), 12);
  }
  EXPECT_EQ(a.snapshot().current_of(MemCategory::Grads), 0);
}

TEST(Allocator, AllocationsAreAlignedZeroedAndChargedTheirExactSize) {
  MemoryTracker t("test");
  for (size_t bytes : {size_t(1), size_t(63), size_t(64), size_t(1000)}) {
    auto* p = static_cast<unsigned char*>(allocate_bytes(bytes, MemCategory::Comm, t));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << bytes;
    for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(p[i], 0) << bytes;
    EXPECT_EQ(t.snapshot().current_of(MemCategory::Comm), int64_t(bytes));  // not the rounded size
    free_bytes(p, bytes, MemCategory::Comm, t);
    EXPECT_EQ(t.snapshot().current_of(MemCategory::Comm), 0);
  }
  EXPECT_EQ(allocate_bytes(0, MemCategory::Other, t), nullptr);
  EXPECT_EQ(t.snapshot().total_peak, 1000);
}

// Stage threads allocate concurrently on their own trackers, and GPU helpers may share one:
// the counts must stay exact, and the peak must be a total that really happened.
TEST(Allocator, ConcurrentChargesToOneTrackerStayExact) {
  MemoryTracker t("shared");
  const int threads = 4, rounds = 20000;
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i)
    pool.emplace_back([&] {
      for (int r = 0; r < rounds; ++r) t.add(MemCategory::Activations, 3), t.sub(MemCategory::Activations, 3);
    });
  for (auto& th : pool) th.join();
  const MemorySnapshot s = t.snapshot();
  EXPECT_EQ(s.current_of(MemCategory::Activations), 0);
  EXPECT_EQ(s.total_current, 0);
  EXPECT_GE(s.peak_of(MemCategory::Activations), 3);
  EXPECT_LE(s.peak_of(MemCategory::Activations), 3 * threads);
}

TEST(Allocator, OutOfHostMemoryNamesTheCategoryTheTrackerAndWhatToChange) {
  MemoryTracker t("stage 1");
  const size_t huge = size_t(1) << 62;
  try {
    allocate_bytes(huge, MemCategory::Activations, t);
    ADD_FAILURE() << "an allocation of 4 EiB succeeded";
  } catch (const OutOfMemoryError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("activations on stage 1"), std::string::npos) << m;
    EXPECT_NE(m.find("--chunks"), std::string::npos) << m;
  }
  expect_error([&] { allocate_bytes(huge, MemCategory::Weights, t); }, "--stages");
  EXPECT_EQ(t.snapshot().total_peak, 0);  // nothing charged for a failed allocation
}

TEST(Allocator, FormatsBytesInBinaryUnits) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(int64_t(5) << 20), "5.00 MiB");
  EXPECT_EQ(format_bytes(int64_t(3) << 40), "3.00 TiB");
  EXPECT_EQ(format_bytes(-2048), "-2.00 KiB");  // differences of snapshots can be negative
  EXPECT_EQ(mem_category_name(MemCategory::BoundaryState), std::string("boundary"));
}
