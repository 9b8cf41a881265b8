#include "train/stop_signal.h"

#include <atomic>
#include <csignal>
#include <cstring>
#include <string>

namespace stateflow {

static std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free flag");

static void record_signal(int sig) { g_stop_signal.store(sig); }

void install_stop_handlers() {
  g_stop_signal.store(0);
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = record_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND | SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

int stop_signal() { return g_stop_signal.load(); }

const char* signal_name(int sig) {
  if (sig == SIGINT) return "SIGINT";
  if (sig == SIGTERM) return "SIGTERM";
  static thread_local std::string other;
  other = "signal " + std::to_string(sig);
  return other.c_str();
}

}  // namespace stateflow
