// The stages this process runs, each on its own thread: all P of them with the in-process
// transport, or one with MPI. A failure on any stage aborts the transport, so the others stop
// waiting, and the first (root-cause) error is rethrown here.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "pipeline/stage.h"

namespace stateflow {

struct PipelineStepResult {
  double loss = 0;
  LossStats stats;
  std::vector<StageStepResult> stages;  // the stages run here, in rank order
  double makespan_s = 0;                // longest stage wall time (all stages)
  double bubble_fraction = 0;           // 1 - sum(busy) / (P * makespan), all stages
};

class Pipeline {
 public:
  // endpoints: one transport per stage run here (their ranks say which stages).
  Pipeline(const PipelineConfig& cfg, std::vector<std::unique_ptr<Transport>> endpoints);
  PipelineStepResult forward_backward(const Batch& batch);
  double clip_and_update(double lr);
  void zero_grads();
  std::vector<Stage*> stages();
  const PipelineConfig& config() const { return cfg_; }
  bool runs_all_stages() const { return int(stages_.size()) == cfg_.stages; }
  int first_rank() const { return endpoints_.front()->rank(); }
  // The maximum of v over all processes of the run (v itself when this process runs all stages).
  double max_over_processes(double v);

 private:
  // Runs fn(stage i) for every local stage concurrently; rethrows the root-cause error.
  void run_all(const std::function<void(int)>& fn);
  PipelineConfig cfg_;
  std::vector<std::unique_ptr<Transport>> endpoints_;
  std::vector<std::unique_ptr<Stage>> stages_;
};

// The in-process pipeline: all stages, one thread each, local transport.
std::unique_ptr<Pipeline> make_local_pipeline(const PipelineConfig& cfg);

}  // namespace stateflow
