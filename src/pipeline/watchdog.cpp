#include "pipeline/watchdog.h"

#include <cstdio>
#include <cstdlib>

#include "core/error.h"

namespace stateflow {

static std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

Watchdog::Watchdog(double timeout_s, double grace_s, Action on_timeout, Action on_stuck)
    : timeout_(seconds(timeout_s)),
      grace_(seconds(grace_s)),
      on_timeout_(std::move(on_timeout)),
      on_stuck_(on_stuck ? std::move(on_stuck) : Action(print_and_exit)) {
  SF_CHECK(timeout_s > 0 && grace_s >= 0, "watchdog: the timeout must be positive and the grace >= 0, got ",
           timeout_s, " and ", grace_s);
  thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

int64_t Watchdog::watch(std::string what, std::function<bool()> done) {
  std::lock_guard<std::mutex> l(mu_);
  const int64_t id = next_id_++;
  watched_[id] = Watched{std::move(what), std::move(done), Clock::now()};
  wake_.notify_all();
  return id;
}

void Watchdog::forget(int64_t id) {
  std::lock_guard<std::mutex> l(mu_);
  watched_.erase(id);
}

bool Watchdog::fired() const {
  std::lock_guard<std::mutex> l(mu_);
  return fired_;
}

void Watchdog::print_and_exit(const std::string& why) {
  std::fprintf(stderr, "error: %s\n", why.c_str());
  std::fflush(stderr);
  std::_Exit(1);  // the stuck thread would never let destructors finish
}

// Sleeps until the oldest watched operation is due; checks it then, not before: a done one is
// dropped, one still running fires on_timeout. After that only the grace period is watched.
void Watchdog::run() {
  std::unique_lock<std::mutex> l(mu_);
  std::string why;
  Clock::time_point stuck_at{};
  while (!stopping_) {
    if (fired_) {
      if (Clock::now() >= stuck_at) {
        l.unlock();
        on_stuck_(why + "; the process did not stop after aborting, so it exits");
        return;
      }
      wake_.wait_until(l, stuck_at);
      continue;
    }
    Clock::time_point due = Clock::time_point::max();
    for (auto it = watched_.begin(); it != watched_.end();) {
      const Clock::time_point deadline = it->second.since + timeout_;
      if (deadline > Clock::now()) {
        due = std::min(due, deadline);
        ++it;
      } else if (it->second.done()) {
        it = watched_.erase(it);
      } else {
        why = cat(it->second.what, " did not complete within ",
                  std::chrono::duration<double>(timeout_).count(),
                  " s: its peer stalled or died (raise --timeout if its steps are legitimately that slow)");
        break;
      }
    }
    if (!why.empty()) {
      fired_ = true;
      l.unlock();
      on_timeout_(why);
      l.lock();
      stuck_at = Clock::now() + grace_;
      continue;
    }
    if (due == Clock::time_point::max())
      wake_.wait(l);
    else
      wake_.wait_until(l, due);
  }
}

}  // namespace stateflow
