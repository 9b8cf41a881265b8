// `stateflow verify`: one training step's forward and backward on one stage with one chunk
// (the reference), and again through the pipeline (P stages, M microbatches, the chosen
// schedule, D data-parallel replicas sharing the batch) under several chunkings, from the
// same weights and batch; reports the max relative difference of the loss, of every
// parameter gradient (MATH.md section 8) and of the weights after one clipped AdamW step.
// On the GPU the reference is the float64 CPU run of the same weights and batch, and each
// chunking must stay within twice the unsplit GPU run's error against it.
#pragma once
#include <iosfwd>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "model/config.h"
#include "train/data.h"

namespace stateflow {

struct VerifyOptions {
  ModelConfig model = model_preset("tiny");
  DType dtype = DType::F64;
  Device device = Device::CPU;
  DataConfig data;
  int64_t batch = 2;
  int64_t seq_len = 45;  // not a multiple of the tiny preset's block size 8
  int stages = 1;
  int data_parallel = 0;  // replicas, one process per rank (0: world size / stages)
  int microbatches = 1;
  std::string schedule = "stateflow";
  std::string transport = "local";
  double timeout_s = 120;
  bool split_sms = false;  // --sm-split (PipelineConfig::split_sms)
  bool recompute = false;
  std::vector<std::vector<int64_t>> chunkings;  // empty: the built-in set
  double tolerance = 0;                         // CPU runs; 0: 1e-10 for f64, 1e-4 for f32
  // Compare with the float64 CPU run of the same weights and batch instead of the unsplit run
  // on the same device: a chunking passes when its mean gradient error and its mean weight
  // error after the update are at most twice the unsplit run's, and so is its loss error
  // (floored at 1e-3). Always on with --device cuda,
  // where bf16 rounding differs from chunking to chunking.
  bool against_f64 = false;
};

struct VerifyColumn {
  std::string label;  // e.g. "N=3 even"
  std::vector<int64_t> lengths;
  double loss_diff = 0;
  std::vector<double> grad_diffs;  // per parameter, model.params() order
  double max_grad_diff = 0;
  double mean_grad_diff = 0;  // over the parameters of >= 64 entries (not per-head scalars)
  double update_diff = 0;  // the weights after one AdamW step from these gradients
  double mean_update_diff = 0;  // the same parameters
  bool passed = true;
};

struct VerifyResult {
  std::vector<std::string> param_names;
  std::vector<VerifyColumn> columns;
  // against_f64: the unsplit run (one stage, one chunk, on the device) against the float64 CPU run.
  bool against_f64 = false;
  VerifyColumn unsplit;
  double max_rel_grad_diff = 0;
  double max_rel_loss_diff = 0;
  double max_rel_update_diff = 0;
  double tolerance = 0;  // the fixed bound (not against_f64)
  bool report = true;  // false on the ranks of an MPI run that do not print
  bool passed() const {
    for (const VerifyColumn& c : columns)
      if (!c.passed) return false;
    return true;
  }
};

// The built-in chunkings for a sequence length: even N in {2,3,4,8}, uneven, unaligned to
// the block size C, very short chunks, and one token per chunk.
std::vector<std::pair<std::string, std::vector<int64_t>>> builtin_chunkings(int64_t seq_len, int64_t block);

VerifyResult run_verify(const VerifyOptions& opts);
void print_verify(const VerifyResult& r, std::ostream& os);

}  // namespace stateflow
