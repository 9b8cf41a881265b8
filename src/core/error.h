// Errors: every failure the user can cause is reported as stateflow::Error with a message
// that names the problem and, where there is one, the fix.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace stateflow {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Host or device memory ran out: callers that sweep settings (the benchmark) mark the run as
// out of memory and go on; everyone else sees an Error whose message names what to change.
struct OutOfMemoryError : Error {
  using Error::Error;
};

template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

template <class... Args>
[[noreturn]] void fail(const Args&... args) {
  throw Error(cat(args...));
}

}  // namespace stateflow

// SF_CHECK(cond, "message parts", value, ...): throws stateflow::Error when cond is false.
#define SF_CHECK(cond, ...)                          \
  do {                                               \
    if (!(cond)) ::stateflow::fail(__VA_ARGS__);     \
  } while (0)
