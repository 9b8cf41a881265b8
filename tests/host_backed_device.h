// A stand-in for the GPU in CPU-only tests: while it lives, Device::CUDA tensors are host memory
// charged to the stand-in's own tracker instead of the caller's, so the caller's tracker counts
// what a GPU-placed model leaves on the host. Kernels do not run on it: it is for placement and
// memory accounting (model set-up, optimizer state), not for forward or backward.
#pragma once
#include <cstring>
#include <memory>

#include "core/device.h"
#include "core/error.h"

namespace stateflow::testing {

class HostBackedDevice : public DeviceBackend {
 public:
  MemoryTracker tracker{"host-backed device"};

  HostBackedDevice() : previous_(device_available(Device::CUDA) ? &device_backend(Device::CUDA) : nullptr) {
    register_device_backend(Device::CUDA, this);
  }
  ~HostBackedDevice() override { register_device_backend(Device::CUDA, previous_); }
  HostBackedDevice(const HostBackedDevice&) = delete;
  HostBackedDevice& operator=(const HostBackedDevice&) = delete;

  void* allocate(size_t bytes, MemCategory c, MemoryTracker&, bool) override { return allocate_bytes(bytes, c, tracker); }
  void free(void* p, size_t bytes, MemCategory c, MemoryTracker&) override { free_bytes(p, bytes, c, tracker); }
  void zero(void* p, size_t bytes) override { std::memset(p, 0, bytes); }
  void copy(void* dst, Device, const void* src, Device, size_t bytes) override { std::memmove(dst, src, bytes); }
  void synchronize() override {}
  void use_device(int) override {}
  void release_memory(MemoryTracker&) override {}
  void release_cached_memory(MemoryTracker&) override {}
  std::unique_ptr<DeviceClock> make_clock() override { fail("the host-backed test device has no clock"); }

 private:
  DeviceBackend* previous_;
};

}  // namespace stateflow::testing
