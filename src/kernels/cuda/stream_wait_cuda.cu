#include "kernels/cuda/stream_wait_cuda.h"

#include <cuda.h>  // the driver's types and enums only: the function comes from the runtime's query

#include <map>
#include <mutex>

#include "kernels/cuda/cuda_check.h"

namespace stateflow {
namespace {

using WaitValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

// cuStreamWaitValue32 as the CUDA 12 ABI defines it (the v2 stream memory operations), or null.
WaitValue32 wait_value32() {
  static const WaitValue32 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &p, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();  // not sticky; keep it out of the next launch check
      return WaitValue32(nullptr);
    }
    return reinterpret_cast<WaitValue32>(p);
  }();
  return fn;
}

// One wait on a word that already holds its value, on a non-blocking stream of its own (nothing on
// the legacy stream, which another thread's graph capture may forbid). The word comes from
// cudaMalloc: a probe that took it from cudaMallocAsync (and freed it with cudaFreeAsync) answered
// false on the H200, this one true (which call refused was not isolated). It is never freed (4 bytes per GPU and process): cudaFree synchronizes
// the device, which another thread's capture may not allow either.
bool probe() {
  if (!wait_value32()) return false;
  unsigned* word = nullptr;
  cudaStream_t s = nullptr;
  if (cudaMalloc(reinterpret_cast<void**>(&word), sizeof(unsigned)) != cudaSuccess) return cudaGetLastError(), false;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return cudaGetLastError(), false;
  const bool ok = cudaMemsetAsync(word, 0, sizeof(unsigned), s) == cudaSuccess &&
                  wait_value32()(reinterpret_cast<CUstream>(s), reinterpret_cast<CUdeviceptr>(word), 0,
                                 CU_STREAM_WAIT_VALUE_GEQ) == CUDA_SUCCESS &&
                  cudaStreamSynchronize(s) == cudaSuccess;
  cudaStreamDestroy(s);
  cudaGetLastError();  // a refused probe is an answer, not an error for the next launch check
  return ok;
}

}  // namespace

bool stream_wait_available() {
  static std::mutex m;
  static std::map<int, bool> per_gpu;
  int gpu = 0;
  cuda_check(cudaGetDevice(&gpu), "cudaGetDevice");
  std::lock_guard<std::mutex> lock(m);
  auto it = per_gpu.find(gpu);
  if (it == per_gpu.end()) it = per_gpu.emplace(gpu, probe()).first;
  return it->second;
}

void stream_wait_geq(cudaStream_t stream, const unsigned* word, unsigned value) {
  SF_CHECK(wait_value32(), "CUDA: cuStreamWaitValue32 is not available from this driver (check stream_wait_available())");
  const CUresult r = wait_value32()(reinterpret_cast<CUstream>(stream), reinterpret_cast<CUdeviceptr>(word), value,
                                    CU_STREAM_WAIT_VALUE_GEQ);
  SF_CHECK(r == CUDA_SUCCESS, "CUDA: cuStreamWaitValue32 failed with driver error ", int(r));
}

}  // namespace stateflow
