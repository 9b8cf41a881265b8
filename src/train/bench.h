// `stateflow bench`: the chosen schedules side by side on the same model, weights and
// batches; the model is built once and every run reshapes its pipeline. Per run: tokens/s over timed steps (forward + backward; weights are not updated,
// so every run sees the same model), peak bytes per stage by category (the allocator's
// count) and, on GPUs, the driver's bytes in use per GPU, peak stash on each stage, the
// measured bubble fraction, and the bubble the simulator predicts from the per-action times
// measured in the same run. With a chunk sweep, stateflow runs once per N and the best N is
// marked. A run that runs out of memory becomes an "OOM" row and the benchmark goes on.
#pragma once
#include <functional>
#include <iosfwd>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/device.h"
#include "core/dtype.h"
#include "model/config.h"
#include "pipeline/launch.h"
#include "pipeline/layer_profile.h"
#include "pipeline/simulate.h"
#include "train/data.h"

namespace stateflow {

using PipelineFactory = std::function<std::unique_ptr<Pipeline>(const PipelineConfig&, const std::string& transport)>;

// One run the planner chose (--chunks auto): what it is and what the simulator predicted.
struct PlannedRun {
  std::string label;  // "equal", "balanced", "best alpha", "tuned 1f1b", ...
  std::string schedule;
  int microbatches = 1;
  bool recompute = false;
  std::vector<int64_t> chunk_lengths;
  double predicted_step_s = 0;
  int64_t predicted_peak_bytes = 0;  // the fullest stage's, working memory included
};

struct BenchOptions {
  ModelConfig model = model_preset("small");
  DType dtype = DType::F32;
  Device device = Device::CPU;
  DataConfig data;
  int64_t batch = 8, seq_len = 256;
  int stages = 2, microbatches = 8;
  std::vector<int64_t> chunk_lengths;  // for stateflow; 1f1b and gpipe run whole sequences
  std::vector<int> chunk_sweep;        // non-empty: stateflow once per N (nearly equal chunks) instead
  std::vector<std::string> schedules{"1f1b", "stateflow"};
  std::string transport = "local";
  double timeout_s = 120;
  bool split_sms = false;  // --sm-split (PipelineConfig::split_sms)
  bool recompute = false;
  int warmup_steps = 1, steps = 3;
  // After the timed steps, one more step with every layer call profiled (layer_profile.h):
  // host time to issue vs device time to run, per layer kind and pass.
  bool breakdown = false;
  // With breakdown: the side stream's work stays beside the main stream while it is timed, so
  // each part's time is what the main stream spends on it, waits included (op_timer_keeps_overlap).
  bool breakdown_overlapped = false;
  // Simulated depth (bench_depth.h): stage counts to predict, the models to predict for (empty:
  // the measured one), and the memory of one GPU, above which a prediction is marked OOM.
  std::vector<int> simulate_stages;
  std::vector<ModelConfig> simulate_models;
  double gpu_memory_bytes = 141.0 * (int64_t(1) << 30);  // H200
  // Non-empty (--chunks auto): run these instead of the schedules x chunkings above.
  std::vector<PlannedRun> planned;
  // The runs share one pipeline, reshaped from run to run (the model is built once); true
  // builds a new one for every run instead, as before (to compare, or to rule the reuse out).
  bool rebuild_each_run = false;
  // Builds the runs' pipeline; tests substitute one that fails.
  PipelineFactory make_pipeline = stateflow::make_pipeline;
};

struct BenchRow {
  std::string schedule;
  std::vector<int64_t> chunk_lengths;
  int chunks() const { return int(chunk_lengths.size()); }
  bool oom = false;             // the run ran out of memory; nothing below is measured
  std::string oom_message;      // first line of the error
  bool best = false;            // the fastest stateflow row of a chunk sweep
  std::string label;            // planned runs: which one (PlannedRun::label); else empty
  int microbatches = 0;
  bool recompute = false;
  double predicted_step_s = 0;  // planned runs: the planner's prediction
  int64_t predicted_peak_bytes = 0;
  double tokens_per_s = 0;
  double step_s = 0;                         // mean wall time of a timed step
  // GPU: mean host time of a timed step until all its work was issued (most over stages; 0 on
  // the CPU): near step_s, the host's launches pace the step rather than the device's work.
  double host_issue_s = 0;
  // Device graphs (the `graphs` lever) launched in a timed step, and their nodes (kernels,
  // memsets, copies) on average: what a step hands the device; 0 without graphs.
  double graphs_per_step = 0, nodes_per_graph = 0;
  double loss = 0;                           // mean loss of the timed steps (every row: the same model)
  double bubble_measured = 0;                // mean over timed steps
  double bubble_simulated = 0;               // simulator with the measured per-action times
  std::vector<MemorySnapshot> stage_memory;  // peaks per stage over the timed steps
  std::vector<int64_t> stage_peak_stash;     // peak stash bytes per stage
  std::vector<int64_t> gpu_used_bytes;       // driver, per GPU: most seen after a step (empty on CPU)
  CostTable costs;                           // measured per-action times (mean per stage and chunk)
  std::vector<std::vector<LayerTiming>> layer_timings;  // --breakdown: per stage run here (else empty)
  std::vector<std::vector<OpTiming>> op_timings;        // --breakdown on a GPU: per stage, named parts
  bool op_timings_overlapped = false;                   // measured with --breakdown-overlapped
  int units_per_stage = 0;                              // units (microbatch, chunk) of a step
  int64_t peak_bytes() const;                // the allocator's peak total, most over stages
};

struct BenchResult {
  std::vector<BenchRow> rows;
  bool report = true;  // false on MPI ranks that do not print
};

BenchResult run_bench(const BenchOptions& opts);
// The 1f1b row when it ran (not OOM), else nullptr: the ratios' denominator.
const BenchRow* baseline(const BenchResult& r);
void print_bench(const BenchResult& r, const BenchOptions& opts, std::ostream& os);
// --breakdown's tables: per row and stage, host and device ms per unit by layer kind and pass,
// then (GPU) device ms per step by named part of the layers' work (GEMMs, kernels).
void print_layer_breakdown(const BenchResult& r, std::ostream& os);
nlohmann::json bench_json(const BenchResult& r, const BenchOptions& opts);
// The inverse of bench_json: a recorded run (e.g. from the GPU machine) as its result and the
// options that shape it (model, batch, sequence length, stages, microbatches, recomputation),
// so that predict_depths can be run on it again later, anywhere. Other fields of `opts` are
// kept. Throws Error naming the file and the field when the JSON is not such a record.
BenchResult bench_from_json(const nlohmann::json& j, BenchOptions& opts, const std::string& where);

}  // namespace stateflow
