// What the CUDA benchmark programs share: the CUDA error check that ends the program, random
// inputs made on the device from a counter hash (the same numbers on every run), event-timed
// medians, and the counts a benchmark checks its outputs with.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                                               \
  do {                                                                                                      \
    cudaError_t e_ = (x);                                                                                   \
    if (e_ != cudaSuccess) {                                                                                \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, __LINE__, #x); \
      std::exit(1);                                                                                         \
    }                                                                                                       \
  } while (0)

namespace stateflow::bench {

__device__ inline float hash_uniform(uint64_t i, uint64_t seed) {  // (0, 1)
  uint64_t z = i * 0x9E3779B97F4A7C15ull + seed;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (float(z >> 40) + 0.5f) * (1.0f / 16777216.0f);
}
__device__ inline float hash_normal(uint64_t i, uint64_t seed) {
  return sqrtf(-2.f * logf(hash_uniform(2 * i, seed))) * cospif(2.f * hash_uniform(2 * i + 1, seed));
}

inline unsigned blocks(int64_t n, int t) { return unsigned((n + t - 1) / t); }

// Median of reps event-timed calls of f after 3 warm-ups, in ms.
template <class F>
float median_ms(F&& f, int reps) {
  for (int i = 0; i < 3; ++i) f();
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(e0));
    f();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float t = 0;
    CK(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t);
  }
  CK(cudaGetLastError());
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

__global__ inline void count_differences(const unsigned char* a, const unsigned char* b, int64_t n,
                                         unsigned long long* diff) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n && a[i] != b[i]) atomicAdd(diff, 1ull);  // a count, not a gradient
}

__global__ inline void count_nonfinite(const __nv_bfloat16* x, int64_t n, unsigned long long* bad) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n && !isfinite(__bfloat162float(x[i]))) atomicAdd(bad, 1ull);  // a count, not a gradient
}

// "1,2,3" -> {1, 2, 3}
inline std::vector<int64_t> parse_list(const char* s) {
  std::vector<int64_t> v;
  for (const char* p = s; *p;) {
    char* end = nullptr;
    v.push_back(std::strtoll(p, &end, 10));
    p = *end == ',' ? end + 1 : end;
  }
  return v;
}

}  // namespace stateflow::bench
