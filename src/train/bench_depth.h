// Simulated depth: what each benchmarked schedule would do on P stages, predicted by the
// simulator from the per-action costs one bench run measured (issue 6: deeper pipelines than
// the GPUs at hand). Blocks are weighed in units of the measured model's average block (mixer
// + MLP, model/flops.h and the mixer registry): forward and backward FLOPs per token and
// activation width (for a model of equal blocks, a stage weighs its block count). From the
// measured run, per chunk:
//   - an average block's forward and backward time: the stages before the last, divided by
//     their blocks' weight (stage 0's embedding is folded in); a one-stage run (one device, no
//     contention from a second stage) splits its stage's time between the blocks and the LM
//     head by their FLOPs, counts its stash as the blocks' and its transient memory for all;
//   - the LM head's: what the last stage takes beyond its blocks at that rate (0 if timing
//     noise makes that negative; otherwise the measured shape reproduces the measured costs);
//   - a send's time: the mean Send action;
//   - an average block's stash per unit: the stages' peak stash divided by the units the
//     schedule keeps in flight there (in_flight_bound), per unit of width as above; the head's
//     the rest;
//   - bytes per parameter of weights, grads and optimizer state, and the transient working
//     memory (peak total less those and the stash): the most over the stages before the
//     last, and the last's (it holds the LM head's logits) on its own.
// A stage of the P-stage pipeline (blocks cut evenly by cost) then costs its blocks' weight at
// those rates plus the head on the last; its memory is its parameters' bytes, its transient
// memory, the stash of the units in flight as the simulator walks the schedule, and the K/V
// prefixes of its attention blocks per microbatch in flight (their formula, docs/attention.md;
// the measured run's kv_prefix is left out of its transient memory). For another
// model (--simulate-model) the weights are its blocks' FLOPs and widths in the measured model's
// units, the head scales by d_model x vocab, transient bytes by the average block width, sends
// by d_model.
#pragma once
#include <iosfwd>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "model/flops.h"
#include "train/bench.h"

namespace stateflow {

struct DepthPrediction {
  std::string schedule;
  int stages = 0, chunks = 0;
  double step_s = 0, tokens_per_s = 0, bubble = 0;
  std::vector<int64_t> stage_peak_bytes;  // weights + grads + optimizer + transient + peak stash + kv_prefix
  int64_t peak_bytes = 0;                 // most over stages
  int64_t peak_kv_prefix_bytes = 0;       // K/V prefixes and their gradients, most over stages (0: no attention)
  bool oom = false;                       // peak_bytes above BenchOptions::gpu_memory_bytes
  bool best = false;                      // fastest stateflow prediction that fits, per stage count
};

struct DepthPredictions {
  ModelConfig model;  // the model predicted for
  bool scaled = false;  // another model than measured: the ratios below apply
  double forward_ratio = 1, backward_ratio = 1, head_ratio = 1, width_ratio = 1;
  std::vector<DepthPrediction> rows;  // by stage count, then in the measured rows' order
};

// Throws Error, before anything runs, when a prediction asked for cannot be made: a model with
// fewer blocks than a stage count.
void check_depth_targets(const BenchOptions& o);

// For `target`: one prediction per measured row that ran (not OOM) and per
// BenchOptions::simulate_stages. A measured run of one stage works too (see the header).
DepthPredictions predict_depths(const BenchResult& r, const BenchOptions& o, const ModelConfig& target);
void print_depth_predictions(const DepthPredictions& p, const BenchOptions& o, std::ostream& os);
nlohmann::json depth_predictions_json(const DepthPredictions& p, const BenchOptions& o);

}  // namespace stateflow
