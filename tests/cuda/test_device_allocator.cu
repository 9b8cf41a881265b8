// Caching device allocator: tracker accounting per category (current and peak) equals what
// was asked for, freed blocks come back for requests of the same size class, an impossible
// request throws an Error that names the settings to change, and threads may share it.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "kernels/cuda/device_allocator.h"
#include "cuda_test_util.h"
#include "test_util.h"

namespace stateflow {
namespace {

using testing::fresh_seed;

TEST(DeviceAllocator, SizeClassesCoverTheRequestWithLittleWaste) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  EXPECT_EQ(DeviceAllocator::size_class(1), 512u);
  EXPECT_EQ(DeviceAllocator::size_class(512), 512u);
  EXPECT_EQ(DeviceAllocator::size_class(513), 1024u);
  for (int i = 0; i < 2000; ++i) {
    const size_t bytes = 1 + rng.below(uint64_t(1) << (1 + rng.below(36)));
    const size_t c = DeviceAllocator::size_class(bytes);
    ASSERT_GE(c, bytes);
    ASSERT_EQ(c % 512, 0u) << bytes;
    if (bytes > (size_t(1) << 20)) ASSERT_LE(double(c), 1.125 * double(bytes)) << bytes;
    ASSERT_EQ(DeviceAllocator::size_class(c), c) << "a class is its own class";
  }
}

TEST(DeviceAllocator, ChargesTheTrackerPerCategoryLikeHostTensors) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  MemoryTracker tracker("gpu");
  DeviceAllocator alloc(tracker);
  const MemCategory cats[] = {MemCategory::Weights, MemCategory::Activations, MemCategory::BoundaryState};
  std::vector<std::pair<void*, std::pair<MemCategory, int64_t>>> live;
  int64_t expect[kNumMemCategories] = {}, expect_peak[kNumMemCategories] = {}, total = 0, total_peak = 0;
  for (int i = 0; i < 200; ++i) {
    if (!live.empty() && rng.uniform() < 0.4) {  // free a random live block
      const size_t k = rng.below(live.size());
      alloc.free(live[k].first);
      expect[int(live[k].second.first)] -= live[k].second.second;
      total -= live[k].second.second;
      live.erase(live.begin() + int64_t(k));
    } else {
      const MemCategory c = cats[rng.below(3)];
      const int64_t bytes = int64_t(1 + rng.below(3 << 20));
      void* p = alloc.allocate(size_t(bytes), c);
      ASSERT_NE(p, nullptr);
      ASSERT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);
      live.push_back({p, {c, bytes}});
      expect[int(c)] += bytes;
      total += bytes;
      expect_peak[int(c)] = std::max(expect_peak[int(c)], expect[int(c)]);
      total_peak = std::max(total_peak, total);
    }
    const MemorySnapshot s = tracker.snapshot();
    for (MemCategory c : cats) {
      ASSERT_EQ(s.current_of(c), expect[int(c)]) << mem_category_name(c) << " after step " << i;
      ASSERT_EQ(s.peak_of(c), expect_peak[int(c)]) << mem_category_name(c) << " after step " << i;
    }
    ASSERT_EQ(s.total_current, total);
    ASSERT_EQ(s.total_peak, total_peak);
  }
  int64_t in_use = 0;
  for (auto& [p, cb] : live) in_use += int64_t(DeviceAllocator::size_class(size_t(cb.second)));
  EXPECT_EQ(alloc.stats().in_use, in_use);
  for (auto& [p, cb] : live) alloc.free(p);
  EXPECT_EQ(tracker.snapshot().total_current, 0);
  EXPECT_EQ(alloc.stats().in_use, 0);
}

TEST(DeviceAllocator, FreedBlocksAreReusedWithinTheirSizeClass) {
  SKIP_WITHOUT_GPU();
  MemoryTracker tracker("gpu");
  DeviceAllocator alloc(tracker);
  void* a = alloc.allocate(3000000, MemCategory::Activations);
  const int64_t mallocs = alloc.stats().device_mallocs;
  alloc.free(a);
  EXPECT_EQ(alloc.stats().cached, int64_t(DeviceAllocator::size_class(3000000)));
  // A different size of the same class, in another category: the same block, no driver call.
  void* b = alloc.allocate(2990000, MemCategory::Weights);
  EXPECT_EQ(b, a);
  EXPECT_EQ(alloc.stats().device_mallocs, mallocs);
  EXPECT_EQ(alloc.stats().reuses, 1);
  EXPECT_EQ(tracker.snapshot().current_of(MemCategory::Weights), 2990000);
  EXPECT_EQ(tracker.snapshot().current_of(MemCategory::Activations), 0);
  // A larger class needs a new block.
  void* c = alloc.allocate(6000000, MemCategory::Weights);
  EXPECT_NE(c, b);
  EXPECT_EQ(alloc.stats().device_mallocs, mallocs + 1);
  alloc.free(b), alloc.free(c);
  alloc.release_cached();
  EXPECT_EQ(alloc.stats().cached, 0);
  EXPECT_THROW(alloc.free(b), Error) << "double free must be caught";
}

TEST(DeviceAllocator, SameCallSequenceGetsTheSameBlocks) {
  SKIP_WITHOUT_GPU();
  MemoryTracker tracker("gpu");
  DeviceAllocator alloc(tracker);
  auto run = [&] {  // allocate, then free in reverse: the free lists end as they began
    std::vector<void*> held;
    for (size_t bytes : {1000, 70000, 1000, 5000000, 70000}) held.push_back(alloc.allocate(bytes, MemCategory::Other));
    for (auto it = held.rbegin(); it != held.rend(); ++it) alloc.free(*it);
    return held;
  };
  const auto first = run();
  EXPECT_EQ(run(), first);
  EXPECT_EQ(alloc.stats().device_mallocs, 5) << "the second run must be served from the cache";
  EXPECT_EQ(alloc.stats().reuses, 5);
}

TEST(DeviceAllocator, OutOfMemoryNamesTheSettingsToChange) {
  SKIP_WITHOUT_GPU();
  MemoryTracker tracker("gpu");
  DeviceAllocator alloc(tracker);
  const size_t absurd = size_t(1) << 50;  // 1 PiB
  for (const char* needle : {"out of GPU memory", "--chunks", "--microbatches", "recompute", "activations"})
    testing::expect_error([&] { alloc.allocate(absurd, MemCategory::Activations); }, needle);
  EXPECT_EQ(tracker.snapshot().total_current, 0) << "a failed request charges nothing";
  void* p = alloc.allocate(4096, MemCategory::Other);  // still usable afterwards
  EXPECT_NE(p, nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the failed cudaMalloc's error must be cleared";
  alloc.free(p);
}

TEST(DeviceAllocator, DriverFigureSeesTheAllocations) {
  SKIP_WITHOUT_GPU();
  MemoryTracker tracker("gpu");
  DeviceAllocator alloc(tracker);
  const int64_t before = device_used_bytes();
  DeviceBuffer buf(alloc, size_t(1) << 30, MemCategory::Activations);
  EXPECT_GE(device_used_bytes() - before, int64_t(1) << 30);
  EXPECT_EQ(tracker.snapshot().current_of(MemCategory::Activations), int64_t(1) << 30);
  buf.reset();
  EXPECT_EQ(tracker.snapshot().current_of(MemCategory::Activations), 0);
  EXPECT_EQ(tracker.snapshot().peak_of(MemCategory::Activations), int64_t(1) << 30);
}

TEST(DeviceAllocator, ThreadsShareOneAllocator) {
  SKIP_WITHOUT_GPU();
  MemoryTracker tracker("gpu");
  DeviceAllocator alloc(tracker);
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      Rng rng = Rng::derive(seed, uint64_t(t));
      std::vector<void*> held;
      for (int i = 0; i < 300; ++i) {
        held.push_back(alloc.allocate(size_t(1 + rng.below(1 << 16)), MemCategory::Activations));
        if (held.size() > 8) {
          const size_t k = rng.below(held.size());
          alloc.free(held[k]);
          held.erase(held.begin() + int64_t(k));
        }
      }
      for (void* p : held) alloc.free(p);
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(tracker.snapshot().total_current, 0);
  EXPECT_EQ(alloc.stats().in_use, 0);
}

}  // namespace
}  // namespace stateflow
