// Learning-rate schedule: linear warmup, then cosine decay to a floor.
//
// `step` counts optimizer updates from 0 (the rate for the first update is at(0)):
//   step <  warmup:           peak * (step + 1) / warmup   (at(0) = peak/warmup, at(warmup-1) = peak)
//   warmup <= step <= total:  min + (peak - min) * (1 + cos(pi * (step - warmup) / (total - warmup))) / 2
//   step >= total:            min
// So at(warmup) = peak and at(total) = min. warmup = 0 starts at peak; min = peak is a
// constant rate.
#pragma once
#include <cstdint>

namespace stateflow {

struct LrSchedule {
  double peak = 3e-4;
  double min = 3e-5;
  int64_t warmup = 0;
  int64_t total = 1000;

  double at(int64_t step) const;  // validates, then evaluates
  void validate() const;          // throws Error naming the bad field
};

}  // namespace stateflow
