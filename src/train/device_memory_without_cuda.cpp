// CPU-only builds: no GPU to ask.
#include "train/device_memory.h"

namespace stateflow {

std::vector<int64_t> gpu_used_bytes() { return {}; }
std::string gpu_name() { return {}; }

}  // namespace stateflow
