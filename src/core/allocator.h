// Memory accounting. Every tensor's bytes come from allocate_bytes(), which charges them to
// a category on a MemoryTracker (current and peak per category, and peak of the total).
// The tracker and the category are thread-local settings, so each pipeline stage (one
// thread) counts its own memory, and code charges activations vs. states by scope.
#pragma once
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace stateflow {

// KvPrefix: the sequence-wide K/V buffers of attention layers and their gradients (one per
// layer and microbatch in flight), apart from the fixed-size boundary states.
enum class MemCategory { Weights, Grads, Optimizer, Activations, BoundaryState, KvPrefix, Comm, Other, Count };
constexpr int kNumMemCategories = static_cast<int>(MemCategory::Count);
const char* mem_category_name(MemCategory c);

struct MemorySnapshot {
  std::array<int64_t, kNumMemCategories> current{}, peak{};
  int64_t total_current = 0, total_peak = 0;
  int64_t peak_of(MemCategory c) const { return peak[static_cast<int>(c)]; }
  int64_t current_of(MemCategory c) const { return current[static_cast<int>(c)]; }
};

class MemoryTracker {
 public:
  explicit MemoryTracker(std::string name = "cpu") : name_(std::move(name)) {}
  void add(MemCategory c, int64_t bytes);
  void sub(MemCategory c, int64_t bytes);
  MemorySnapshot snapshot() const;
  // Forget peaks (current values stay): start a new measurement window.
  void reset_peaks();
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  std::array<std::atomic<int64_t>, kNumMemCategories> current_{}, peak_{};
  std::atomic<int64_t> total_current_{0}, total_peak_{0};
};

// The process-wide default tracker, used when a thread has not chosen one.
MemoryTracker& default_tracker();
MemoryTracker& current_tracker();
MemCategory current_category();

// RAII: allocations on this thread go to `t` while the scope lives.
class TrackerScope {
 public:
  explicit TrackerScope(MemoryTracker& t);
  ~TrackerScope();
  TrackerScope(const TrackerScope&) = delete;
  TrackerScope& operator=(const TrackerScope&) = delete;

 private:
  MemoryTracker* prev_;
};

// RAII: allocations on this thread are charged to `c` while the scope lives.
class CategoryScope {
 public:
  explicit CategoryScope(MemCategory c);
  ~CategoryScope();
  CategoryScope(const CategoryScope&) = delete;
  CategoryScope& operator=(const CategoryScope&) = delete;

 private:
  MemCategory prev_;
};

// 64-byte aligned, zero-initialised; charged to the current tracker and category.
void* allocate_bytes(size_t bytes, MemCategory c, MemoryTracker& t);
void free_bytes(void* p, size_t bytes, MemCategory c, MemoryTracker& t);

std::string format_bytes(int64_t bytes);

}  // namespace stateflow
