#include "train/lr_schedule.h"

#include <cmath>
#include <numbers>

#include "core/error.h"

namespace stateflow {

void LrSchedule::validate() const {
  SF_CHECK(std::isfinite(peak) && peak > 0, "learning-rate schedule: peak = ", peak, " must be > 0");
  SF_CHECK(std::isfinite(min) && min >= 0 && min <= peak, "learning-rate schedule: min = ", min,
           " must be in [0, peak = ", peak, "]");
  SF_CHECK(warmup >= 0, "learning-rate schedule: warmup = ", warmup, " steps must be >= 0");
  SF_CHECK(total >= warmup, "learning-rate schedule: total = ", total, " steps must be >= warmup = ", warmup);
}

double LrSchedule::at(int64_t step) const {
  validate();
  SF_CHECK(step >= 0, "learning-rate schedule: step ", step, " must be >= 0");
  if (step < warmup) return peak * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (step >= total) return min;
  double progress = static_cast<double>(step - warmup) / static_cast<double>(total - warmup);
  return min + (peak - min) * 0.5 * (1 + std::cos(std::numbers::pi * progress));
}

}  // namespace stateflow
