#include "core/parallel.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace stateflow {

static std::atomic<int> max_threads{0};  // 0: the machine's cores

void set_parallel_for_max_threads(int n) { max_threads = std::max(n, 0); }

void parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
  const int cap = max_threads.load();
  const int64_t threads = std::min<int64_t>(n, cap > 0 ? cap : std::max(1u, std::thread::hardware_concurrency()));
  std::atomic<int64_t> next{0};
  std::mutex error_mutex;
  std::exception_ptr error;
  auto work = [&] {
    for (int64_t i; (i = next++) < n;) {
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        next = n;
      }
    }
  };
  std::vector<std::thread> helpers;
  for (int64_t t = 1; t < threads; ++t) helpers.emplace_back(work);
  work();
  for (std::thread& h : helpers) h.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace stateflow
