#include "train/device_memory.h"

#include <cuda_runtime.h>

#include "core/device.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_allocator.h"

namespace stateflow {

std::vector<int64_t> gpu_used_bytes() {
  // Asking a GPU the CPU run never touched would start a context on it.
  if (!device_available(Device::CUDA)) return {};
  int count = 0, current = 0;
  cuda_check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  cuda_check(cudaGetDevice(&current), "cudaGetDevice");
  std::vector<int64_t> used;
  for (int d = 0; d < count; ++d) {
    cuda_check(cudaSetDevice(d), "cudaSetDevice");
    used.push_back(device_used_bytes());
  }
  cuda_check(cudaSetDevice(current), "cudaSetDevice");
  return used;
}

std::string gpu_name() {
  if (!device_available(Device::CUDA)) return {};
  int current = 0;
  cuda_check(cudaGetDevice(&current), "cudaGetDevice");
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, current), "cudaGetDeviceProperties");
  return prop.name;
}

}  // namespace stateflow
