// One pipeline stage: it builds and owns its slice of the model (weights, grads, optimizer
// state, all counted on its own memory tracker), and interprets its lowered action list for
// a step: receive, forward, send, backward, in the order the schedule gives. On a GPU a stage
// lives on one thread, which drives its GPU: build it, run it and destroy it there.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/cross_entropy.h"
#include "model/model.h"
#include "pipeline/grad_reduce.h"
#include "pipeline/schedule.h"
#include "pipeline/stage_executor.h"
#include "pipeline/trace.h"
#include "pipeline/transport.h"
#include "pipeline/batch.h"
#include "model/optimizer.h"

namespace stateflow {

struct PipelineConfig {
  ModelConfig model = model_preset("tiny");
  DType dtype = DType::F32;
  Device device = Device::CPU;  // every stage's layers on this device (GPU 0 for all stages)
  int stages = 1;
  int microbatches = 1;
  std::vector<int64_t> chunk_lengths;  // of every sequence; must sum to the batch's seq_len
  ScheduleKind schedule = ScheduleKind::StateFlow;
  AdamWConfig adamw;
  double clip = 1.0;         // global gradient-norm clip (0: off)
  double timeout_s = 120.0;  // transport: longest wait for a peer
  bool recompute = false;    // full recomputation per layer (keep layer inputs, not stashes)
  // --sm-split: stages on one GPU (the local transport), each on its own 1/P of its
  // multiprocessors, side by side, instead of taking turns on the whole GPU.
  bool split_sms = false;
  // Data parallelism: replicas of the pipeline (0: the launch's world size / stages; local
  // and single-process runs have 1), and the size of the gradient buckets they sum.
  int data_parallel = 0;
  int64_t bucket_bytes = kDefaultBucketBytes;
};

// On a GPU the times are the device's (CUDA events on the compute stream around every action,
// seconds from an event at the step start): kernels run asynchronously, so host clocks would
// time their launches. A stage waiting for data then shows up as time before its next compute.
struct StageStepResult {
  double loss = 0;  // the step's mean loss (all stages agree: it is all-reduced)
  LossStats stats;  // all-reduced
  std::vector<TimedAction> timeline;  // this stage's actions (sends/receives too), seconds from step start
  double busy_s = 0;                  // time in compute actions (sum of their durations)
  double wall_s = 0;                  // from the step start to this stage's last action end
  // On a GPU, host seconds from the step start until every action was issued (the device may
  // still be running them); near wall_s, the host's issuing is what paces the step.
  double host_issue_s = 0;
  double makespan_s = 0;              // max wall_s over all stages (all-reduced)
  double total_busy_s = 0;            // sum of busy_s over all stages (all-reduced)
  double bubble_fraction() const { return makespan_s > 0 ? 1.0 - total_busy_s / (P * makespan_s) : 0.0; }
  int P = 1;
};

// Whether two configurations build the same stages (model, precision, device, stage count,
// optimizer, transport and data parallelism) and so differ at most in what reshape() changes.
// Returns "" when they do, else the first field that differs.
std::string model_and_placement_difference(const PipelineConfig& a, const PipelineConfig& b);

class Stage {
 public:
  // Builds the stage's layers under its own tracker, on the transport's GPU for this rank when
  // it names one (selected for the calling thread). The schedule is generated, checked and
  // lowered here; an invalid shape (P, M, N) throws with the checker's explanation.
  // Destroying a stage returns its device memory to the driver: its tensors must all be gone
  // by then, messages left in a transport too.
  // group: under data parallelism, this stage's group transport (one rank per replica): the
  // gradients are summed over it, bucket by bucket, from the stage's last backward on.
  Stage(const PipelineConfig& cfg, int rank, Transport& transport, Transport* group = nullptr);
  Stage(const Stage&) = delete;
  Stage& operator=(const Stage&) = delete;
  // Runs every action of one step for this stage. Grads accumulate (zero them before).
  StageStepResult forward_backward(const Batch& batch);
  // Global gradient norm over all stages (all-reduced): NaN or Inf when any grad is.
  double grad_norm();
  // The last parameter (in model order) of this stage whose grad holds a NaN or Inf, i.e.
  // where the backward pass first produced one; empty when every grad is finite.
  std::string last_nonfinite_grad();
  // Clips the grads to cfg.clip given the global norm, then this stage's AdamW step.
  void clip_and_update(double lr, double norm);
  void zero_grads();
  // Between steps: runs the next steps with next's schedule, microbatches, chunk lengths and
  // recomputation (the schedule is made again when its shape changes). Everything else of next must be this stage's (same_model_and_placement):
  // the model, its weights, grads and optimizer state stay as they are.
  void reshape(const PipelineConfig& next);
  // Returns the device blocks the stage's allocator keeps cached to the driver (GPU stages).
  void release_cached_device_memory();

  int rank() const { return rank_; }
  Model& model() { return *model_; }
  MemoryTracker& tracker() { return tracker_; }
  const Schedule& schedule() const { return lowered_; }
  AdamW& optimizer() { return *optimizer_; }
  StageExecutor& executor() { return *executor_; }
  GradientReducer* reducer() { return reducer_.get(); }

 private:
  PipelineConfig cfg_;
  int rank_;
  Transport& transport_;
  MemoryTracker tracker_;
  // Gives the tracker's device memory back when the stage goes, also when its constructor
  // fails: declared after the tracker and before every member holding tensors, so it runs
  // after their destructors and before the tracker's.
  struct DeviceMemoryRelease {
    MemoryTracker& tracker;
    Device device;
    ~DeviceMemoryRelease();
  } device_memory_;
  Schedule lowered_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<StageExecutor> executor_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<DeviceClock> clock_;  // GPU stages: times the actions
  std::unique_ptr<GradientReducer> reducer_;  // data parallelism only
  size_t last_backward_ = 0;                  // index of the step's last backward action
  // Generates, checks and lowers the schedule for cfg_'s shape (lowered_, last_backward_).
  void make_actions();
  // Whether other stages of this process run on this stage's GPU (--transport local with
  // --device cuda puts them all on the current one): their threads' device-wide
  // synchronisations then rule out device graphs here (StageExecutor::allow_graphs).
  bool shares_gpu() const { return cfg_.device == Device::CUDA && transport_.cuda_device() < 0 && cfg_.stages > 1; }
};

}  // namespace stateflow
