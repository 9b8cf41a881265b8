// Online chunk tuning (`train --chunks auto`): the profile's cost model, corrected by what the
// run itself measures. After each of its first steps (the first is a warm-up and only
// measured from the second on) it adds the step's per-chunk times to a CostCalibration
// (cost_calibration.h: the profile's terms refitted, the message latency fitted) and asks the
// planner for the best N and partition with the run's schedule, M and recompute on the
// calibrated costs. When that is predicted at least
// `min_gain` faster than the current one, the pipeline switches to it before the next step. The loss and gradients are exact under any partition, so a switch
// changes speed only.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "pipeline/pipeline.h"
#include "train/cost_calibration.h"
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

 private:
  Plan plan_;  // what --chunks auto chose: the run's schedule, M and recompute
  CostCalibration calibration_;
  int rounds_left_;
  double min_gain_;
  bool warmed_up_ = false;
};

}  // namespace stateflow
