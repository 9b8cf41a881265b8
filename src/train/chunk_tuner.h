// Online chunk tuning (`train --chunks auto`): the profile's cost model, corrected by what the
// run itself measures. After each of its first steps (the first is a warm-up and only
// measured from the second on) it takes every stage's mean forward and backward time per
// chunk, fits per stage and pass how far the profile's linear and pair terms are off (two
// non-negative factors, over every step seen so far), fits the latency of a message between
// stages to the measured step time, and asks the planner for the best N and partition with
// the run's schedule, M and recompute on the corrected costs. When that is predicted at least
// `min_gain` faster than the current one, the pipeline switches to it before the next step. The loss and gradients are exact under any partition, so a switch
// changes speed only.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "pipeline/pipeline.h"
#include "train/planner.h"

namespace stateflow {

struct TuningDecision {
  std::string message;                                // one line for the log
  std::optional<std::vector<int64_t>> chunk_lengths;  // set: switch to these
};

class ChunkTuner {
 public:
  // auto_chunks: what --chunks auto chose (its space fixes the run's schedule, M, recompute).
  ChunkTuner(AutoChunks auto_chunks, int rounds = 3, double min_gain = 0.02);
  // After a step run with `lengths`: its measured times (gathered over processes through
  // `pipe`). Nothing once the rounds are over.
  std::optional<TuningDecision> after_step(const PipelineStepResult& step, const std::vector<int64_t>& lengths,
                                           Pipeline& pipe);
  // The stage costs corrected by the measurements so far.
  const std::vector<PassCosts>& tuned_stage_costs() const { return tuned_; }

 private:
  AutoChunks chosen_;
  PlanSpace space_;  // chosen_'s, with the fitted message latency
  std::vector<PassCosts> profiled_, tuned_;
  int rounds_left_;
  double min_gain_;
  bool warmed_up_ = false;
  // Per stage and pass (0 forward, 1 backward): rows (linear part, pair part) and measured times.
  std::vector<std::vector<std::array<double, 3>>> rows_[2];
  std::vector<std::vector<double>> values_[2];
};

}  // namespace stateflow
