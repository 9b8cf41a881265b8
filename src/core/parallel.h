// Runs fn(i) for every i in [0, n) on up to as many threads as the machine has cores (the
// caller's thread among them), in no particular order; returns when all are done. The first
// exception any call throws is rethrown here (the calls not yet started are skipped).
#pragma once
#include <cstdint>
#include <functional>

namespace stateflow {

void parallel_for(int64_t n, const std::function<void(int64_t)>& fn);

// Caps the threads of every later parallel_for (at least 1; 0 restores the default, the
// machine's cores). For measurement: model_build_bench --draw-threads 1 times the weight draw
// and the bf16 casts with each tensor on its layer's thread, against the default pieces.
void set_parallel_for_max_threads(int n);

}  // namespace stateflow
