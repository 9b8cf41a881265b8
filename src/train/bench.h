// `stateflow bench`: the chosen schedules side by side on the same model, weights and
// batches. Per schedule: tokens/s over timed steps (forward + backward; weights are not
// updated, so every schedule sees the same model), peak bytes per stage by category (the
// allocator's count), peak stash on each stage, the measured bubble fraction, and the bubble
// the simulator predicts from the per-action times measured in the same run.
#pragma once
#include <iosfwd>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/device.h"
#include "core/dtype.h"
#include "model/config.h"
#include "train/data.h"

namespace stateflow {

struct BenchOptions {
  ModelConfig model = model_preset("small");
  DType dtype = DType::F32;
  Device device = Device::CPU;
  DataConfig data;
  int64_t batch = 8, seq_len = 256;
  int stages = 2, microbatches = 8;
  std::vector<int64_t> chunk_lengths;  // for stateflow; 1f1b and gpipe run whole sequences
  std::vector<std::string> schedules{"1f1b", "stateflow"};
  std::string transport = "local";
  double timeout_s = 120;
  bool recompute = false;
  int warmup_steps = 1, steps = 3;
};

struct BenchRow {
  std::string schedule;
  int chunks = 1;
  double tokens_per_s = 0;
  double step_s = 0;                         // mean wall time of a timed step
  double bubble_measured = 0;                // mean over timed steps
  double bubble_simulated = 0;               // simulator with the measured per-action times
  std::vector<MemorySnapshot> stage_memory;  // peaks per stage over the timed steps
  std::vector<int64_t> stage_peak_stash;     // peak stash bytes per stage
};

struct BenchResult {
  std::vector<BenchRow> rows;
  bool report = true;  // false on MPI ranks that do not print
};

BenchResult run_bench(const BenchOptions& opts);
void print_bench(const BenchResult& r, const BenchOptions& opts, std::ostream& os);
void write_bench_json(const BenchResult& r, const BenchOptions& opts, const std::string& path);

}  // namespace stateflow
