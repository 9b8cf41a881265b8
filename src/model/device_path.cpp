#include "model/device_path.h"

#include <map>

#include "core/error.h"

namespace stateflow {

static std::map<std::string, DevicePath>& paths() {
  static std::map<std::string, DevicePath> by_kind;
  return by_kind;
}

DevicePathRegistration::DevicePathRegistration(const std::string& kind, DevicePath path) {
  SF_CHECK(paths().emplace(kind, path).second, "two GPU paths registered for layer kind '", kind, "'");
}

const DevicePath& device_path(const std::string& kind) {
  auto it = paths().find(kind);
  SF_CHECK(it != paths().end(), "layer '", kind, "' has no GPU path in this build",
           paths().empty() ? ": this build has no CUDA support; rebuild with nvcc found by CMake"
                           : ": run models with such blocks on the CPU (--device cpu)");
  return it->second;
}

bool has_device_path(const std::string& kind) { return paths().count(kind) > 0; }

}  // namespace stateflow
