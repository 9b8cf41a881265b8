#include "core/device.h"

#include "core/error.h"

namespace stateflow {

static DeviceBackend* g_cuda_backend = nullptr;

const char* device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

Device parse_device(const std::string& s) {
  if (s == "cpu") return Device::CPU;
  if (s == "cuda" || s == "gpu") return Device::CUDA;
  fail("unknown device '", s, "': use cpu or cuda");
}

void register_device_backend(Device d, DeviceBackend* b) {
  SF_CHECK(d == Device::CUDA, "register_device_backend: host memory needs no backend");
  g_cuda_backend = b;
}

bool device_available(Device d) { return d == Device::CPU || g_cuda_backend != nullptr; }

DeviceBackend& device_backend(Device d) {
  SF_CHECK(d == Device::CUDA, "device_backend: host memory has no backend");
  SF_CHECK(g_cuda_backend != nullptr,
           "no CUDA backend: build with CUDA (nvcc found by CMake) and call init_cuda_backend() at start-up");
  return *g_cuda_backend;
}

}  // namespace stateflow
