// CPU-only builds: no GPU to ask and no device cache to release.
#include "train/device_memory.h"

namespace stateflow {

std::vector<int64_t> gpu_used_bytes() { return {}; }

std::function<void()> device_cache_releaser(const std::vector<MemoryTracker*>&) {
  return [] {};
}

}  // namespace stateflow
