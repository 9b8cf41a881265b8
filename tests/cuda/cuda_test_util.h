// Helpers shared by the CUDA kernel tests: skipping without a GPU, device copies of host data
// in the storage type under test, NaN poisoning of outputs, and bitwise comparisons.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "core/rng.h"
#include "gpu_test_model.h"

namespace stateflow::testing {

using bf16 = __nv_bfloat16;
using Vec = std::vector<double>;

inline std::string gpu_missing() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(e);
  if (n == 0) return "no CUDA device";
  return "";
}

#define SKIP_WITHOUT_GPU()                                          \
  do {                                                              \
    const std::string why = ::stateflow::testing::gpu_missing();    \
    if (!why.empty()) GTEST_SKIP() << why << " (GPU test skipped)"; \
  } while (0)

// Sets one of the calling thread's kernel switches (a `bool& ..._for_thread()`, kernels/cuda/)
// until the scope ends: a test runs a new path and the old one it must equal.
struct FlagScope {
  bool& flag;
  bool before;
  FlagScope(bool& f, bool value) : flag(f), before(f) { flag = value; }
  FlagScope(const FlagScope&) = delete;
  FlagScope& operator=(const FlagScope&) = delete;
  ~FlagScope() { flag = before; }
};

// x rounded to what storage type T holds (the inputs the CPU reference must see).
template <class T>
double round_to(double x) {
  return double(float(T(float(x))));
}

template <class T>
Vec rounded(Vec x) {
  for (double& e : x) e = round_to<T>(e);
  return x;
}

inline Vec normal_vec(Rng& rng, size_t n, double scale = 1.0) {
  Vec v(n);
  for (double& x : v) x = scale * rng.normal();
  return v;
}

// A device array of n T's, freed at scope end; upload/get convert through float.
template <class T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t n_) : n(n_) { EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess); }
  explicit Dev(const Vec& h) : Dev(h.size()) { upload(h); }
  Dev(Dev&& o) noexcept : p(o.p), n(o.n) { o.p = nullptr, o.n = 0; }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() { cudaFree(p); }
  void upload(const Vec& h) {
    std::vector<T> t(h.size());
    for (size_t i = 0; i < h.size(); ++i) t[i] = T(float(h[i]));
    put(t);
  }
  void put(const std::vector<T>& t) {
    EXPECT_EQ(cudaMemcpy(p, t.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  void poison() { put(std::vector<T>(n, T(std::numeric_limits<float>::quiet_NaN()))); }
  std::vector<T> raw() const {
    std::vector<T> t(n);
    EXPECT_EQ(cudaMemcpy(t.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return t;
  }
  Vec get() const {
    Vec h;
    for (T x : raw()) h.push_back(double(float(x)));
    return h;
  }
  // The array's bytes appended to out (for comparing several outputs byte for byte at once).
  void append_bytes(std::vector<char>& out) const {
    const std::vector<T> v = raw();
    const char* b = reinterpret_cast<const char*>(v.data());
    out.insert(out.end(), b, b + v.size() * sizeof(T));
  }
};

// Integer device arrays (token ids, targets).
inline Dev<int32_t> upload_ids(const std::vector<int32_t>& ids) {
  Dev<int32_t> d(ids.size());
  EXPECT_EQ(cudaMemcpy(d.p, ids.data(), ids.size() * sizeof(int32_t), cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}

// Tokens [t0, t1) of a [batch, len, heads, w] tensor (d: any dims with batch, len, heads).
template <class Dims>
Vec slice_time(const Vec& x, const Dims& d, int64_t w, int64_t t0, int64_t t1) {
  Vec y;
  for (int64_t b = 0; b < d.batch; ++b)
    y.insert(y.end(), x.begin() + ((b * d.len + t0) * d.heads) * w, x.begin() + ((b * d.len + t1) * d.heads) * w);
  return y;
}

inline bool has_nan(const Vec& x) {
  for (double e : x)
    if (std::isnan(e)) return true;
  return false;
}

template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

inline void sync_ok() { ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError()); }

// Relative-error bands of METHOD.md (max|x - ref| / max|ref|): fp32 arithmetic lands far under
// 1e-5 of the largest entry, bf16 storage between 1e-3 and 1e-2.
template <class A>
constexpr double tolerance() {
  return std::is_same_v<A, float> ? 2e-5 : 1.5e-2;
}

}  // namespace stateflow::testing
