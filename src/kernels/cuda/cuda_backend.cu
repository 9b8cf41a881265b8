#include "kernels/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/device.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_graph_cuda.h"

namespace stateflow {

namespace {

// Holds a stream (DeviceClock::hold): spins until the host writes *release, or until
// timeout_ns pass on the device's clock, then says which in *timed_out.
__global__ void hold_stream_kernel(const volatile int* release, int* timed_out, unsigned long long timeout_ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    if (*release) return;
    __nanosleep(2000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < timeout_ns);
  *timed_out = 1;
}

int current_gpu() {
  int d = 0;
  cuda_check(cudaGetDevice(&d), "cudaGetDevice");
  return d;
}

// CUDA events on the thread's compute stream, created on first use and reused after clear().
class CudaClock final : public DeviceClock {
 public:
  ~CudaClock() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);  // destructors must not throw
    if (flags_) {
      flags_[0] = 1;  // a hold still queued must not outlive the flags
      cudaDeviceSynchronize();
      cudaFreeHost(const_cast<int*>(flags_));
    }
  }
  int mark() override {
    if (used_ == events_.size()) {
      cudaEvent_t e = nullptr;
      cuda_check(cudaEventCreate(&e), "cudaEventCreate");
      events_.push_back(e);
    }
    cuda_check(cudaEventRecord(events_[used_], cublas_for_thread().stream()), "cudaEventRecord");
    return int(used_++);
  }
  double seconds_between(int from, int to) override {
    cuda_check(cudaEventSynchronize(events_.at(to)), "cudaEventSynchronize");
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, events_.at(from), events_.at(to)), "cudaEventElapsedTime");
    return ms * 1e-3;
  }
  void clear() override { used_ = 0; }
  void hold() override {
    if (!flags_) {
      void* p = nullptr;  // mapped: the kernel reads what the host writes while it runs
      cuda_check(cudaHostAlloc(&p, 2 * sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable),
                 "cudaHostAlloc (hold flags)");
      flags_ = static_cast<volatile int*>(p);
    }
    flags_[0] = 0;
    flags_[1] = 0;
    std::atomic_thread_fence(std::memory_order_seq_cst);
    hold_stream_kernel<<<1, 1, 0, cublas_for_thread().stream()>>>(flags_, const_cast<int*>(flags_ + 1),
                                                                  1'000'000'000ull);
    cuda_check_launch("hold_stream_kernel");
  }
  void release() override {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    flags_[0] = 1;
  }
  bool hold_timed_out() override { return flags_ && flags_[1] != 0; }

 private:
  std::vector<cudaEvent_t> events_;
  size_t used_ = 0;
  volatile int* flags_ = nullptr;  // [0]: released, [1]: the hold timed out (pinned, mapped)
};

class CudaBackend final : public DeviceBackend {
 public:
  void* allocate(size_t bytes, MemCategory c, MemoryTracker& t, bool zero_fill) override {
    void* p = allocator_for(t).allocate(bytes, c);
    if (p && (zero_fill || zero_fill_all_))
      fill(p, 0, bytes, "cudaMemset (zero-fill of a new device tensor)");
    else if (p && poison_uninitialized_)
      fill(p, 0xff, bytes, "cudaMemset (poison of a new device tensor)");
    return p;
  }
  void set_poison_uninitialized(bool on) { poison_uninitialized_ = on; }
  // On the default stream, or into the thread's graph recording when one is open.
  static void fill(void* p, int value, size_t bytes, const char* what) {
    if (const CublasGemm* r = recording_gemm_for_thread())
      cuda_check(cudaMemsetAsync(p, value, bytes, r->stream()), what);
    else
      cuda_check(cudaMemset(p, value, bytes), what);
  }
  void free(void* p, size_t, MemCategory, MemoryTracker& t) override {
    if (!p) return;
    DeviceAllocator* owner = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = allocators_.find(&t);
      SF_CHECK(it != allocators_.end(), "CUDA backend: a device tensor of tracker '", t.name(),
               "' outlived the release of that tracker's device memory");
      // Usually one GPU per tracker; otherwise the allocator that handed p out.
      for (auto& per_gpu : it->second)
        if (it->second.size() == 1 || per_gpu.second->owns(p)) owner = per_gpu.second.get();
    }
    SF_CHECK(owner != nullptr, "CUDA backend: pointer ", p, " was not allocated for tracker '", t.name(), "'");
    owner->free(p);
  }
  void zero(void* p, size_t bytes) override { fill(p, 0, bytes, "cudaMemset"); }
  void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) override {
    // Inside a graph recording (device_graph_cuda.h) a copy within the device is recorded; one
    // to or from the host cannot be, and fails the recording with an error naming the switch.
    if (const CublasGemm* r = recording_gemm_for_thread(); r && dst_device != Device::CPU && src_device != Device::CPU) {
      cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, r->stream()), "cudaMemcpyAsync (tensor copy)");
      return;
    }
    // Unified addressing tells the direction (and the GPUs) from the pointers.
    cuda_check(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "cudaMemcpy (tensor copy)");
  }
  void synchronize() override { cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }
  void use_device(int index) override { use_cuda_device(index); }
  void release_memory(MemoryTracker& t) override {
    std::map<int, std::unique_ptr<DeviceAllocator>> released;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = allocators_.find(&t);
      if (it == allocators_.end()) return;
      released = std::move(it->second);
      allocators_.erase(it);
    }
    // Destroyed outside the lock: each returns its blocks to the driver of its own GPU.
  }
  void release_cached_memory(MemoryTracker& t) override {
    std::lock_guard<std::mutex> lock(mu_);  // held: no allocator of t goes away meanwhile
    auto it = allocators_.find(&t);
    if (it == allocators_.end()) return;
    for (auto& per_gpu : it->second) per_gpu.second->release_cached();
  }
  std::unique_ptr<DeviceClock> make_clock() override { return std::make_unique<CudaClock>(); }
  std::unique_ptr<DeviceGraph> make_graph() override { return make_cuda_graph(); }
  DeviceGraphCounts graph_counts() const override { return cuda_graph_counts(); }

  DeviceAllocator& allocator_for(MemoryTracker& t) {
    const int gpu = current_gpu();
    std::lock_guard<std::mutex> lock(mu_);
    auto& a = allocators_[&t][gpu];
    if (!a) a = std::make_unique<DeviceAllocator>(t);
    return *a;
  }
  int allocator_count() {
    std::lock_guard<std::mutex> lock(mu_);
    int n = 0;
    for (auto& per_tracker : allocators_) n += int(per_tracker.second.size());
    return n;
  }

 private:
  std::atomic<bool> poison_uninitialized_{false};
  // STATEFLOW_ZERO_FILL_ALL=1: every new device tensor is zero-filled, as before outputs skipped
  // it (to compare speed, or to rule out a kernel that leaves part of its output unwritten).
  const bool zero_fill_all_ = [] {
    const char* v = std::getenv("STATEFLOW_ZERO_FILL_ALL");
    return v && std::string(v) == "1";
  }();
  std::mutex mu_;
  std::unordered_map<MemoryTracker*, std::map<int, std::unique_ptr<DeviceAllocator>>> allocators_;
};

// Never destroyed: tensors held by static objects may be released after main() returns, and
// the driver reclaims the memory at exit anyway.
CudaBackend* g_backend = nullptr;
std::once_flag g_init;

}  // namespace

void init_cuda_backend() {
  std::call_once(g_init, [] {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    SF_CHECK(e == cudaSuccess && n > 0, "--device cuda: no usable CUDA device (",
             e == cudaSuccess ? "none found" : cudaGetErrorString(e), "): run on a GPU machine or use --device cpu");
    cuda_check(cudaSetDevice(0), "cudaSetDevice(0)");
    g_backend = new CudaBackend;
    register_device_backend(Device::CUDA, g_backend);
  });
}

void use_cuda_device(int gpu) {
  init_cuda_backend();
  int n = 0;
  cuda_check(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
  SF_CHECK(gpu >= 0 && gpu < n, "GPU ", gpu, " was asked for, but this machine has ", n,
           " (0 to ", n - 1, "): run one stage per GPU, with at most as many stages as GPUs");
  cuda_check(cudaSetDevice(gpu), "cudaSetDevice");
}

DeviceAllocator& cuda_allocator_for(MemoryTracker& t) {
  SF_CHECK(g_backend != nullptr, "cuda_allocator_for: call init_cuda_backend() first");
  return g_backend->allocator_for(t);
}

void poison_uninitialized_device_tensors(bool on) {
  init_cuda_backend();
  g_backend->set_poison_uninitialized(on);
}

int cuda_allocator_count() { return g_backend ? g_backend->allocator_count() : 0; }

DeviceBuffer cuda_scratch(size_t bytes) { return DeviceBuffer(cuda_allocator_for(current_tracker()), bytes, MemCategory::Other); }

const CublasGemm& cublas_for_thread() {
  // One handle per GPU the thread has used: a handle and its workspace belong to one GPU.
  if (const CublasGemm* recording = recording_gemm_for_thread()) return *recording;
  thread_local std::map<int, std::unique_ptr<CublasGemm>> per_gpu;
  auto& g = per_gpu[current_gpu()];
  if (!g) g = std::make_unique<CublasGemm>(nullptr);
  return *g;
}

}  // namespace stateflow
