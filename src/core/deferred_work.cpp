#include "core/deferred_work.h"

#include <utility>
#include <vector>

#include "core/error.h"

namespace stateflow {
namespace {

struct ThreadDeferred {
  int open_scopes = 0;
  std::vector<std::function<void()>> pending;
};

ThreadDeferred& thread_deferred() {
  thread_local ThreadDeferred d;
  return d;
}

}  // namespace

DeferredWorkScope::DeferredWorkScope() { ++thread_deferred().open_scopes; }

DeferredWorkScope::~DeferredWorkScope() {
  --thread_deferred().open_scopes;
  try {
    finish_deferred_work();
  } catch (...) {  // a device error here was or will be reported by the next checked call
    thread_deferred().pending.clear();
  }
}

bool work_may_be_deferred() { return thread_deferred().open_scopes > 0; }

void defer_work(std::function<void()> finish) {
  SF_CHECK(work_may_be_deferred(), "defer_work: no DeferredWorkScope is open on this thread");
  thread_deferred().pending.push_back(std::move(finish));
}

void finish_deferred_work() {
  // Taken out first: a finish function may join side work, which finishes deferred work again.
  std::vector<std::function<void()>> pending = std::move(thread_deferred().pending);
  thread_deferred().pending.clear();
  for (auto& finish : pending) finish();
}

}  // namespace stateflow
