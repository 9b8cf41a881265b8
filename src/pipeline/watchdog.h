// A watchdog for waits the waiting thread cannot time itself. With one process per GPU, a
// stage's host can block inside a CUDA synchronisation (a device-to-host copy, a free) while
// the device waits for a transfer from a peer; if the peer died, that wait never returns and
// the transport's own timeouts never run. The watchdog's thread watches every operation
// registered with it (e.g. an NCCL transfer, by polling its completion event): one that is not
// done after the timeout fires on_timeout once, which aborts the communicators so that the
// device's wait, and with it the host's, ends in an error. If the process has still not
// destroyed the watchdog `grace` seconds later (its waiting thread is stuck for good), on_stuck
// runs; by default it prints the message and ends the process with exit code 1.
//
// Nothing here depends on CUDA or NCCL, so the logic is tested on the CPU.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace stateflow {

class Watchdog {
 public:
  using Action = std::function<void(const std::string& why)>;
  // on_stuck defaults to print_and_exit.
  Watchdog(double timeout_s, double grace_s, Action on_timeout, Action on_stuck = {});
  ~Watchdog();  // stops the thread: after it, neither action runs
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Watches an operation from now on until done() returns true (done is called on the
  // watchdog's thread, under its lock, so it must not call back into the watchdog) or
  // forget(id). `what` names it and its peer in the timeout message, e.g. "the receive of
  // activation (m 0, c 1) from stage 0".
  int64_t watch(std::string what, std::function<bool()> done);
  void forget(int64_t id);  // also before whatever done() reads is destroyed
  bool fired() const;

  // Writes "error: <why>" to stderr and ends the process with exit code 1, without unwinding.
  static void print_and_exit(const std::string& why);

 private:
  void run();
  using Clock = std::chrono::steady_clock;
  struct Watched {
    std::string what;
    std::function<bool()> done;
    Clock::time_point since;
  };
  const Clock::duration timeout_, grace_;
  Action on_timeout_, on_stuck_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::map<int64_t, Watched> watched_;
  int64_t next_id_ = 0;
  bool stopping_ = false, fired_ = false;
  std::thread thread_;  // last: starts when everything above is ready
};

}  // namespace stateflow
