// The stages this process runs, each on its own thread: all P of them with the in-process
// transport, or one with MPI. A failure on any stage aborts the transport, so the others stop
// waiting, and the first (root-cause) error is rethrown here. Each stage keeps its thread for
// the pipeline's lifetime (built, run and destroyed there): a GPU stage's current device,
// cuBLAS handle and streams are per-thread state. A lone stage not placed on a GPU by its
// transport (MPI) runs on the caller's thread instead.
//
// Data parallelism (one process per rank, grid.h): this process runs one stage of one of D
// replicas. Each step it takes its replica's slice of the global batch, its stage sums the
// gradients over the stage group, and the loss statistics are summed over the replicas, so
// every rank sees the global batch's loss, gradients and gradient norm.
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
  // endpoints: one transport per stage run here (their ranks say which stages). group: under
  // data parallelism, the lone stage's group transport (rank = replica).
  Pipeline(const PipelineConfig& cfg, std::vector<std::unique_ptr<Transport>> endpoints,
           std::unique_ptr<Transport> group = nullptr);
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;
  // batch: the global batch (a replica takes its slice).
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
  // Between steps: cut sequences at these lengths from now on (another chunk count remakes the
  // schedule; every process must make the same change). The loss and gradients stay exact
  // under any partition.
  void set_chunk_lengths(const std::vector<int64_t>& lengths);
  // Between steps: the next steps run with next's schedule, microbatches, chunk lengths and
  // recomputation (Stage::reshape; every process must make the same change). The stages, their
  // weights and threads stay: a benchmark measures several shapes on one model built once.
  void reshape(const PipelineConfig& next);
  // Every stage's cached device blocks back to the driver (between a benchmark's runs).
  void release_cached_device_memory();
  std::vector<Stage*> stages();
  const PipelineConfig& config() const { return cfg_; }
  bool runs_all_stages() const { return int(stages_.size()) == cfg_.stages; }
  int first_rank() const { return endpoints_.front()->rank(); }
  int replica() const { return group_ ? group_->rank() : 0; }
  int replicas() const { return group_ ? group_->world_size() : 1; }
  // The maximum of v over all processes of the run, every replica's (v itself when this process
  // runs the whole run).
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
  std::unique_ptr<Transport> group_;  // data parallelism: the stage group
  std::vector<std::unique_ptr<StageThread>> threads_;  // one per local stage, or none
};

// The in-process pipeline: all stages, one thread each, local transport.
std::unique_ptr<Pipeline> make_local_pipeline(const PipelineConfig& cfg);

}  // namespace stateflow
