// The watchdog that guards one-process-per-GPU runs against a peer dying while the host is
// blocked in a CUDA synchronisation. The NCCL side (on_timeout aborts the communicators, the
// done() check polls a transfer's event) needs GPUs; the logic is tested here: an operation
// that completes, or is forgotten, never fires; one that does not fires on_timeout once,
// naming it and its peer; a waiter blocked until that abort then ends with the error; and a
// process that stays stuck after the abort exits with code 1 and the message.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

#include "pipeline/watchdog.h"
#include "test_util.h"

using namespace stateflow;
using namespace std::chrono_literals;

namespace {
void never(const std::string& why) { ADD_FAILURE() << "unexpected: " << why; }
}  // namespace

TEST(Watchdog, OperationsThatCompleteOrAreForgottenNeverFire) {
  // A timeout far longer than this thread may wait for a CPU between the calls below: at 0.02 s,
  // one 20 ms wait on a loaded 2-core machine would fire it before `done` is set.
  Watchdog w(0.5, 0, never, never);
  std::atomic<bool> done{false};
  w.watch("the receive from stage 1", [&] { return done.load(); });
  const int64_t forgotten = w.watch("the send to stage 2", [] { return false; });
  w.forget(forgotten);
  done = true;  // completes before its deadline is checked
  std::this_thread::sleep_for(1200ms);  // two timeouts: the deadlines have been checked
  EXPECT_FALSE(w.fired());
}

// The NCCL case in miniature: the host blocks in a wait that only the watchdog's abort ends
// (as ncclCommAbort ends the device's wait for a dead peer), then reports the failure.
TEST(Watchdog, AnOperationPastTheTimeoutFiresOnceAndItsAbortEndsTheBlockedWait) {
  std::mutex mu;
  std::condition_variable cv;
  std::string aborted;
  int fires = 0;
  Watchdog w(0.02, 60, [&](const std::string& why) {
    std::lock_guard<std::mutex> l(mu);
    aborted = why, ++fires;
    cv.notify_all();
  }, never);
  w.watch("stage 1: the receive of activation (m 0, c 3) from stage 0", [] { return false; });
  w.watch("stage 1: the send of gradient (m 0, c 2) to stage 0", [] { return false; });
  std::unique_lock<std::mutex> l(mu);
  ASSERT_TRUE(cv.wait_for(l, 30s, [&] { return !aborted.empty(); })) << "the watchdog never fired";
  EXPECT_NE(aborted.find("the receive of activation (m 0, c 3) from stage 0 did not complete within 0.02 s"),
            std::string::npos)
      << aborted;
  EXPECT_NE(aborted.find("--timeout"), std::string::npos) << aborted;
  l.unlock();
  std::this_thread::sleep_for(50ms);
  EXPECT_TRUE(w.fired());
  EXPECT_EQ(fires, 1) << "one abort, however many operations are overdue";
}  // destroyed well within the grace period: on_stuck never runs

TEST(Watchdog, AProcessStillStuckAfterTheGracePeriodIsEnded) {
  std::promise<std::string> stuck;
  std::atomic<int> timeouts{0};
  Watchdog w(0.01, 0.05, [&](const std::string&) { ++timeouts; }, [&](const std::string& why) { stuck.set_value(why); });
  w.watch("stage 0: the receive of gradient (m 1, c 0) from stage 1", [] { return false; });
  auto f = stuck.get_future();
  ASSERT_EQ(f.wait_for(30s), std::future_status::ready) << "on_stuck never ran";
  const std::string why = f.get();
  EXPECT_EQ(timeouts, 1);
  EXPECT_NE(why.find("from stage 1 did not complete"), std::string::npos) << why;
  EXPECT_NE(why.find("exits"), std::string::npos) << why;
}

TEST(WatchdogDeathTest, ByDefaultAStuckProcessExitsWithCode1NamingThePeer) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        Watchdog w(0.01, 0.01, [](const std::string&) {});
        w.watch("stage 1: the receive of activation (m 0, c 0) from stage 0", [] { return false; });
        std::this_thread::sleep_for(30s);  // the stuck host; the watchdog ends the process first
      },
      ::testing::ExitedWithCode(1), "error: stage 1: the receive of activation \\(m 0, c 0\\) from stage 0 did not complete");
}

TEST(Watchdog, RefusesANonPositiveTimeout) {
  stateflow::testing::expect_error([] { Watchdog w(0, 1, never); }, "timeout must be positive");
}
