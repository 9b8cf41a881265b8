#include "core/allocator.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "core/error.h"

namespace stateflow {

const char* mem_category_name(MemCategory c) {
  switch (c) {
    case MemCategory::Weights: return "weights";
    case MemCategory::Grads: return "grads";
    case MemCategory::Optimizer: return "optimizer";
    case MemCategory::Activations: return "activations";
    case MemCategory::BoundaryState: return "boundary";
    case MemCategory::KvPrefix: return "kv_prefix";
    case MemCategory::Comm: return "comm";
    case MemCategory::Other: return "other";
    case MemCategory::Count: break;
  }
  return "?";
}

static void raise_peak(std::atomic<int64_t>& peak, int64_t v) {
  int64_t p = peak.load(std::memory_order_relaxed);
  while (v > p && !peak.compare_exchange_weak(p, v, std::memory_order_relaxed)) {
  }
}

void MemoryTracker::add(MemCategory c, int64_t bytes) {
  int i = static_cast<int>(c);
  raise_peak(peak_[i], current_[i].fetch_add(bytes, std::memory_order_relaxed) + bytes);
  raise_peak(total_peak_, total_current_.fetch_add(bytes, std::memory_order_relaxed) + bytes);
}

void MemoryTracker::sub(MemCategory c, int64_t bytes) {
  current_[static_cast<int>(c)].fetch_sub(bytes, std::memory_order_relaxed);
  total_current_.fetch_sub(bytes, std::memory_order_relaxed);
}

MemorySnapshot MemoryTracker::snapshot() const {
  MemorySnapshot s;
  for (int i = 0; i < kNumMemCategories; ++i) {
    s.current[i] = current_[i].load();
    s.peak[i] = peak_[i].load();
  }
  s.total_current = total_current_.load();
  s.total_peak = total_peak_.load();
  return s;
}

void MemoryTracker::reset_peaks() {
  for (int i = 0; i < kNumMemCategories; ++i) peak_[i].store(current_[i].load());
  total_peak_.store(total_current_.load());
}

MemoryTracker& default_tracker() {
  static MemoryTracker t("cpu");
  return t;
}

static thread_local MemoryTracker* tl_tracker = nullptr;
static thread_local MemCategory tl_category = MemCategory::Other;

MemoryTracker& current_tracker() { return tl_tracker ? *tl_tracker : default_tracker(); }
MemCategory current_category() { return tl_category; }

TrackerScope::TrackerScope(MemoryTracker& t) : prev_(tl_tracker) { tl_tracker = &t; }
TrackerScope::~TrackerScope() { tl_tracker = prev_; }

CategoryScope::CategoryScope(MemCategory c) : prev_(tl_category) { tl_category = c; }
CategoryScope::~CategoryScope() { tl_category = prev_; }

// The settings that shrink memory of category c, for the out-of-memory message.
static const char* memory_advice(MemCategory c) {
  switch (c) {
    case MemCategory::Weights:
    case MemCategory::Grads:
    case MemCategory::Optimizer:
      return "these grow with the model: use a smaller model (d_model, number of blocks, vocab_size, mlp_hidden) or "
             "spread it over more pipeline stages (--stages)";
    default:
      return "these grow with the tokens in flight: use more chunks (--chunks), fewer microbatches "
             "(--microbatches), a smaller --batch or a shorter --seq-len";
  }
}

void* allocate_bytes(size_t bytes, MemCategory c, MemoryTracker& t) {
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = rounded ? std::aligned_alloc(64, rounded) : nullptr;
  if (rounded && !p)
    throw OutOfMemoryError(cat("out of host memory allocating ", format_bytes(static_cast<int64_t>(bytes)), " for ",
                               mem_category_name(c), " on ", t.name(), ": ", memory_advice(c)));
  if (p) std::memset(p, 0, rounded);
  t.add(c, static_cast<int64_t>(bytes));
  return p;
}

void free_bytes(void* p, size_t bytes, MemCategory c, MemoryTracker& t) {
  std::free(p);
  t.sub(c, static_cast<int64_t>(bytes));
}

std::string format_bytes(int64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while ((v >= 1024.0 || v <= -1024.0) && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

}  // namespace stateflow
