// A thread's own object per GPU: streams, their events and cuBLASLt handles belong to one GPU,
// and one thread may drive several (a stage per GPU in one process).
#pragma once
#include <cuda_runtime.h>

#include <map>
#include <memory>

#include "kernels/cuda/cuda_check.h"

namespace stateflow {

// The calling thread's T on its current GPU, made there on first use (T's constructor creates
// what it holds on that GPU) and destroyed at thread exit.
template <class T>
T& per_gpu_for_thread() {
  thread_local std::map<int, std::unique_ptr<T>> per_gpu;
  int gpu = 0;
  cuda_check(cudaGetDevice(&gpu), "cudaGetDevice");
  std::unique_ptr<T>& t = per_gpu[gpu];
  if (!t) t = std::make_unique<T>();
  return *t;
}

}  // namespace stateflow
