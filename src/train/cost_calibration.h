// The profile's cost model corrected by measured runs. The profile times one layer at a time
// on an otherwise idle device; a real step overlaps stages, contends for memory bandwidth and
// waits on messages. Each measured run (every stage's mean forward and backward time per chunk,
// and the step's time) adds to a fit, per stage and pass, of two non-negative factors: how far
// the profile's linear part and its pair part are off (over every run added so far). Then the
// latency per message between stages that makes the simulator's step as long as the measured
// one is found by bisection (the makespan grows with it). Stages sharing one device
// (PlanSpace::shared_device) time each other's work into their actions, so there the fitted
// costs are scaled to the measured step instead, and no latency is fitted. Used by the online tuner
// (chunk_tuner.h) and by `bench --chunks auto` (predictions calibrated on one run).
#pragma once
#include <array>
#include <vector>

#include "pipeline/simulate.h"
#include "pipeline/stage.h"
#include "train/planner.h"

namespace stateflow {

class CostCalibration {
 public:
  CostCalibration(CostModel costs, PlanSpace space);
  // A run of plan p (its schedule, M, recompute and chunk lengths): measured[stage][chunk] mean
  // forward_time / backward_time (backward including the recomputed forward), and its step.
  void add(const Plan& p, const CostTable& measured, double step_s);
  const CostModel& costs() const { return costs_; }
  const std::vector<PassCosts>& stages() const { return tuned_; }
  // The profile's space with the fitted message latency.
  const PlanSpace& space() const { return space_; }
  // p's predicted fields on the calibrated costs.
  void predict(Plan& p) const { predict_plan(costs_, tuned_, space_, p); }

 private:
  CostModel costs_;
  PlanSpace space_;
  std::vector<PassCosts> profiled_, tuned_;
  // Per pass (0 forward, 1 backward) and stage: regressors (linear part, pair part) and times.
  std::vector<std::vector<std::array<double, 3>>> rows_[2];
  std::vector<std::vector<double>> values_[2];
};

// The mean forward and backward time of every (stage, chunk) of one step's timelines (the
// stages run here; a process's missing stages are 0).
CostTable mean_action_times(const std::vector<StageStepResult>& stages, int P, int N);

}  // namespace stateflow
