// Where a tensor's bytes live. Host memory is core's own; device memory comes from a backend
// that the device library registers at start-up (init_cuda_backend() in kernels/cuda), so
// core, and everything CPU-only, builds and runs without CUDA.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/allocator.h"

namespace stateflow {

enum class Device { CPU, CUDA };

const char* device_name(Device d);
Device parse_device(const std::string& s);

// Timestamps of the work queued on the calling thread's device stream, to time work that
// runs asynchronously to the host. The marks of one clock are reused after clear(); a clock
// belongs to the thread (and device) that made it.
class DeviceClock {
 public:
  virtual ~DeviceClock() = default;
  // Queues a timestamp behind the work queued so far; returns its index (0, 1, ... since clear()).
  virtual int mark() = 0;
  // Seconds from mark `from` to mark `to`; waits until the work before `to` is done.
  virtual double seconds_between(int from, int to) = 0;
  // Forgets the marks: the next mark() is index 0 again.
  virtual void clear() = 0;
  // Stops the device's queue here until release(), so that the work queued in between runs
  // back to back afterwards: marks around it then time the work alone, not the host's pace of
  // issuing it. A hold ends by itself after a second, so that a host call that waits for the
  // device cannot hang; hold_timed_out() (read after seconds_between past it) says it did.
  virtual void hold() = 0;
  virtual void release() = 0;
  virtual bool hold_timed_out() = 0;
};

// A run of device work recorded once and launched as one piece (a CUDA graph): the stage
// executor records the kernels of a unit's consecutive blocks this way, so the device runs
// them without a launch between each two. Between begin() and end_and_launch(), the calling
// thread's device work is recorded, not run; end_and_launch() queues it where the thread's
// work goes, as one launch. Each call records anew (the unit's buffers differ) and updates
// the instantiated graph of the previous recording in place where the two have the same
// shape. One graph belongs to one thread.
class DeviceGraph {
 public:
  virtual ~DeviceGraph() = default;
  virtual void begin() = 0;
  virtual void end_and_launch() = 0;
  // Ends a recording left open by an error and drops it; nothing of it runs.
  virtual void abandon() noexcept = 0;
};

// What a device's graphs did so far in this process: recordings launched, and of those how many
// updated the graph instantiated from an earlier recording and how many had to be instantiated
// anew; nodes (kernels, memsets, copies) summed over the launches.
struct DeviceGraphCounts {
  int64_t launched = 0, updated = 0, instantiated = 0, nodes = 0;
};

// Memory operations of one non-host device. Device memory is charged to a MemoryTracker
// category exactly as host memory is. Device work goes to the calling thread's current
// device (use_device), so each pipeline stage's thread can drive its own GPU.
class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  // Zero-filled unless zero_fill is false (then the contents are undefined); 0 bytes may give
  // nullptr.
  virtual void* allocate(size_t bytes, MemCategory c, MemoryTracker& t, bool zero_fill = true) = 0;
  virtual void free(void* p, size_t bytes, MemCategory c, MemoryTracker& t) = 0;
  virtual void zero(void* p, size_t bytes) = 0;
  // Copies between host and device or within the device; returns when dst holds the bytes.
  virtual void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) = 0;
  // Waits for all work queued on the calling thread's device (kernels run asynchronously).
  virtual void synchronize() = 0;
  // Makes device `index` the calling thread's device: its allocations and kernels go there.
  virtual void use_device(int index) = 0;
  // Returns every block of device memory charged to t (cached or not) to the driver; call it
  // when t's device tensors are gone, before t itself goes (a new tracker may reuse its address).
  virtual void release_memory(MemoryTracker& t) = 0;
  // Returns the blocks cached for t (freed tensors' memory kept for reuse) to the driver; t's
  // live tensors stay where they are.
  virtual void release_cached_memory(MemoryTracker& t) = 0;
  virtual std::unique_ptr<DeviceClock> make_clock() = 0;
  // A graph for the calling thread's work, or nullptr when the device has none or graphs are
  // switched off for the thread (the caller then launches its work as it goes).
  virtual std::unique_ptr<DeviceGraph> make_graph() { return nullptr; }
  virtual DeviceGraphCounts graph_counts() const { return {}; }
};

// Installs `b` for device d (not CPU); b must outlive every tensor on d.
void register_device_backend(Device d, DeviceBackend* b);
bool device_available(Device d);
// Throws when no backend was registered for d, naming the fix.
DeviceBackend& device_backend(Device d);

}  // namespace stateflow
