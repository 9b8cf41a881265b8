// Caching allocator for GPU memory. Blocks come from cudaMalloc (never managed memory) in
// size classes; a freed block goes to its class's free list and the next request of that
// class takes it back without a driver call. Every allocation is charged to a MemoryTracker
// category exactly as host tensors are (the requested bytes; current and peak per category),
// so a stage's device memory is reported by the same machinery as its host memory.
//
// Size classes: multiples of 512 B up to 1 MiB; above that, 8 classes per power of two, so a
// block is at most 12.5 % larger than asked. Free lists are last-in-first-out: the same
// sequence of calls gets the same blocks. All methods may be called from any thread.
//
// An allocator belongs to the GPU current when it was made, and returns blocks to that GPU
// from any thread. A freed block may be handed out again at once. That is safe for work
// ordered on one stream (the usual case: a stage's kernels run on its stream); a caller that
// frees memory still in use on another stream must synchronise first.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/allocator.h"

namespace stateflow {

class DeviceAllocator {
 public:
  explicit DeviceAllocator(MemoryTracker& tracker);
  ~DeviceAllocator();  // returns every block, cached or not, to the driver
  DeviceAllocator(const DeviceAllocator&) = delete;
  DeviceAllocator& operator=(const DeviceAllocator&) = delete;

  // At least 256-byte aligned, contents undefined; 0 bytes gives nullptr. When the device is
  // out of memory, the cache is released and the request retried once; if it still fails,
  // throws stateflow::Error naming the settings that lower memory use.
  void* allocate(size_t bytes, MemCategory c);
  // p must come from allocate() of this allocator (nullptr is ignored).
  void free(void* p);
  // Returns every cached (free) block to the driver.
  void release_cached();
  // Whether p is a block this allocator handed out and that is not freed yet.
  bool owns(void* p) const;

  struct Stats {
    int64_t in_use = 0;          // bytes of blocks handed out (whole size classes)
    int64_t cached = 0;          // bytes of free blocks kept for reuse
    int64_t device_mallocs = 0;  // cudaMalloc calls that succeeded
    int64_t reuses = 0;          // requests served from the cache
  };
  Stats stats() const;
  MemoryTracker& tracker() const { return tracker_; }

  static size_t size_class(size_t bytes);

 private:
  struct Block {
    size_t size;       // size class
    size_t requested;  // bytes charged to the tracker
    MemCategory category;
  };
  // Both expect mu_ to be held.
  void* device_malloc(size_t size, size_t requested, MemCategory c);
  void release_cached_locked();

  MemoryTracker& tracker_;
  int device_;  // the GPU the blocks live on
  mutable std::mutex mu_;
  std::unordered_map<void*, Block> live_;
  std::map<size_t, std::vector<void*>> free_;  // size class -> free blocks
  Stats stats_;
};

// Bytes the driver reports in use on the current device (cudaMemGetInfo: total - free),
// everything of every process and context included: the figure to show beside the tracked one.
int64_t device_used_bytes();

// A block of device memory returned to its allocator when the buffer goes out of scope.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceAllocator& a, size_t bytes, MemCategory c) : alloc_(&a), p_(a.allocate(bytes, c)), bytes_(bytes) {}
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      alloc_ = o.alloc_, p_ = o.p_, bytes_ = o.bytes_;
      o.alloc_ = nullptr, o.p_ = nullptr, o.bytes_ = 0;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  template <class T = void>
  T* get() const { return static_cast<T*>(p_); }
  size_t bytes() const { return bytes_; }
  void reset() {
    if (alloc_) alloc_->free(p_);
    alloc_ = nullptr, p_ = nullptr, bytes_ = 0;
  }

 private:
  DeviceAllocator* alloc_ = nullptr;
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace stateflow
