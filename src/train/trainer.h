// The training loop: batches from a DataSource, a pipeline of P stages (one stage is the
// plain case) running the chosen schedule over microbatches and chunks, global gradient
// clipping, AdamW with warmup + cosine learning rate, progress lines.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "pipeline/pipeline.h"
#include "train/data.h"

namespace stateflow {

struct TrainOptions {
  ModelConfig model = model_preset("small");
  DType dtype = DType::F32;
  Device device = Device::CPU;
  DataConfig data;
  // Defaults: the CPU demo, which learns associative recall in a few minutes on 2 cores.
  int64_t steps = 500;
  int64_t batch = 16;  // sequences per step
  int64_t seq_len = 128;
  int stages = 2;
  int microbatches = 2;
  int64_t chunks = 4;                  // used when chunk_lengths is empty
  std::vector<int64_t> chunk_lengths;  // explicit cut, must sum to seq_len
  std::string schedule = "stateflow";
  std::string transport = "local";
  double timeout_s = 120;
  bool recompute = false;
  double lr = 3e-3, min_lr = 3e-4;
  int64_t warmup = 20;
  AdamWConfig adamw;
  double clip = 1.0;
  int64_t log_every = 25;
  std::string trace_path;  // Chrome trace of the last step's executed timeline

  std::vector<int64_t> resolved_chunk_lengths() const;
  PipelineConfig pipeline_config() const;
  void validate() const;  // throws Error naming the bad option
};

struct StepReport {
  int64_t step = 0;
  double loss = 0, accuracy = 0, grad_norm = 0, lr = 0, seconds = 0, bubble_fraction = 0;
  int64_t tokens = 0;
};

class Trainer {
 public:
  explicit Trainer(const TrainOptions& opts);
  StepReport step();
  Pipeline& pipeline() { return *pipeline_; }
  const TrainOptions& options() const { return opts_; }
  // Runs opts.steps steps, printing progress every log_every steps to `log` (rank 0 only).
  std::vector<StepReport> run(std::ostream& log);

 private:
  TrainOptions opts_;
  std::unique_ptr<DataSource> data_;
  std::unique_ptr<Pipeline> pipeline_;
  PipelineStepResult last_;
  int64_t step_ = 0;
};

// "weights 1.2 MiB, grads ..., activations ... | total ...": peak bytes of each category used.
std::string format_peak_memory(const MemorySnapshot& s);

}  // namespace stateflow
