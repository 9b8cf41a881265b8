// Runs fn(i) for every i in [0, n) on up to as many threads as the machine has cores (the
// caller's thread among them), in no particular order; returns when all are done. The first
// exception any call throws is rethrown here (the calls not yet started are skipped).
#pragma once
#include <cstdint>
#include <functional>

namespace stateflow {

void parallel_for(int64_t n, const std::function<void(int64_t)>& fn);

}  // namespace stateflow
