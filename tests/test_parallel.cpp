// parallel_for: every index once, exceptions rethrown, and a thread cap of one runs every call
// on the caller's thread (what model_build_bench --draw-threads 1 relies on).
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/parallel.h"

using namespace stateflow;

TEST(ParallelFor, RunsEveryIndexOnceAndRethrows) {
  std::vector<std::atomic<int>> seen(1000);
  parallel_for(1000, [&](int64_t i) { ++seen[i]; });
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], 1) << i;
  EXPECT_THROW(parallel_for(100, [](int64_t i) { if (i == 37) throw std::runtime_error("37"); }), std::runtime_error);
}

TEST(ParallelFor, ACapOfOneRunsEveryCallOnTheCallersThread) {
  std::mutex mu;
  std::set<std::thread::id> threads;
  set_parallel_for_max_threads(1);
  parallel_for(64, [&](int64_t) {
    std::lock_guard<std::mutex> lock(mu);
    threads.insert(std::this_thread::get_id());
  });
  set_parallel_for_max_threads(0);
  ASSERT_EQ(threads.size(), 1u);
  EXPECT_EQ(*threads.begin(), std::this_thread::get_id());
}
