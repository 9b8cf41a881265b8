// Where a tensor's bytes live. Host memory is core's own; device memory comes from a backend
// that the device library registers at start-up (init_cuda_backend() in kernels/cuda), so
// core, and everything CPU-only, builds and runs without CUDA.
#pragma once
#include <cstddef>
#include <string>

#include "core/allocator.h"

namespace stateflow {

enum class Device { CPU, CUDA };

const char* device_name(Device d);
Device parse_device(const std::string& s);

// Memory operations of one non-host device. Device memory is charged to a MemoryTracker
// category exactly as host memory is.
class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  // Zero-filled; 0 bytes may give nullptr.
  virtual void* allocate(size_t bytes, MemCategory c, MemoryTracker& t) = 0;
  virtual void free(void* p, size_t bytes, MemCategory c, MemoryTracker& t) = 0;
  virtual void zero(void* p, size_t bytes) = 0;
  // Copies between host and device or within the device; returns when dst holds the bytes.
  virtual void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) = 0;
  // Waits for all work queued on the device (kernels run asynchronously to the host).
  virtual void synchronize() = 0;
};

// Installs `b` for device d (not CPU); b must outlive every tensor on d.
void register_device_backend(Device d, DeviceBackend* b);
bool device_available(Device d);
// Throws when no backend was registered for d, naming the fix.
DeviceBackend& device_backend(Device d);

}  // namespace stateflow
