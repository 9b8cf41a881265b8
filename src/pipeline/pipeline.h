// The stages this process runs, each on its own thread: all P of them with the in-process
// transport, or one with MPI. A failure on any stage aborts the transport, so the others stop
// waiting, and the first (root-cause) error is rethrown here. Each stage keeps its thread for
// the pipeline's lifetime (built, run and destroyed there): a GPU stage's current device,
// cuBLAS handle and streams are per-thread state. A lone stage not placed on a GPU by its
// transport (MPI) runs on the caller's thread instead.
#pragma once
#include <functional>
#include <memory>
#include <string>
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

class StageThread;

class Pipeline {
 public:
  // endpoints: one transport per stage run here (their ranks say which stages).
  Pipeline(const PipelineConfig& cfg, std::vector<std::unique_ptr<Transport>> endpoints);
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;
  PipelineStepResult forward_backward(const Batch& batch);
  // Global gradient norm over all stages: NaN or Inf when any grad is.
  double grad_norm();
  // Where a non-finite gradient first appeared in the backward pass: the highest stage with
  // one, and there the last parameter in model order (named only when that stage runs in
  // this process). stage = -1 when every grad is finite.
  struct NonfiniteGrad {
    int stage = -1;
    std::string param;
  };
  NonfiniteGrad locate_nonfinite_grad();
  // Clips to the config's clip given grad_norm()'s result, then every stage's AdamW step.
  void clip_and_update(double lr, double norm);
  void zero_grads();
  std::vector<Stage*> stages();
  const PipelineConfig& config() const { return cfg_; }
  bool runs_all_stages() const { return int(stages_.size()) == cfg_.stages; }
  int first_rank() const { return endpoints_.front()->rank(); }
  // The maximum of v over all processes of the run (v itself when this process runs all stages).
  double max_over_processes(double v);
  double sum_over_processes(double v);

 private:
  // Runs fn(i) on local stage i's thread, for every stage concurrently; rethrows the
  // root-cause error.
  void run_all(const std::function<void(int)>& fn);
  void destroy_stages();
  PipelineConfig cfg_;
  // Declared before the endpoints so that it is destroyed after them: messages a failed step
  // left in a transport hold memory charged to a stage's tracker.
  std::vector<std::unique_ptr<Stage>> stages_;
  std::vector<std::unique_ptr<Transport>> endpoints_;
  std::vector<std::unique_ptr<StageThread>> threads_;  // one per local stage, or none
};

// The in-process pipeline: all stages, one thread each, local transport.
std::unique_ptr<Pipeline> make_local_pipeline(const PipelineConfig& cfg);

}  // namespace stateflow
