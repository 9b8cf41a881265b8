// The training loop on one stage: batches from a DataSource, chunked forward/backward,
// gradient clipping, AdamW with warmup + cosine learning rate, progress lines.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <vector>

#include "model/model.h"
#include "train/data.h"
#include "train/optimizer.h"

namespace stateflow {

struct TrainOptions {
  ModelConfig model = model_preset("small");
  DType dtype = DType::F32;
  DataConfig data;
  int64_t steps = 400;
  int64_t batch = 8;  // sequences per step
  int microbatches = 1;
  int64_t seq_len = 256;
  int64_t chunks = 4;                  // used when chunk_lengths is empty
  std::vector<int64_t> chunk_lengths;  // explicit cut, must sum to seq_len
  double lr = 3e-3, min_lr = 3e-4;
  int64_t warmup = 20;
  AdamWConfig adamw;
  double clip = 1.0;
  int64_t log_every = 10;

  std::vector<int64_t> resolved_chunk_lengths() const;
  void validate() const;  // throws Error naming the bad option
};

struct StepReport {
  int64_t step = 0;
  double loss = 0, accuracy = 0, grad_norm = 0, lr = 0, seconds = 0;
  int64_t tokens = 0;
};

class Trainer {
 public:
  explicit Trainer(const TrainOptions& opts);
  StepReport step();
  Model& model() { return *model_; }
  const TrainOptions& options() const { return opts_; }
  // Runs opts.steps steps, printing a progress line every log_every steps to `log`.
  std::vector<StepReport> run(std::ostream& log);

 private:
  TrainOptions opts_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<DataSource> data_;
  std::unique_ptr<AdamW> optimizer_;
  std::vector<int64_t> chunk_lengths_;
  int64_t step_ = 0;
};

// "weights 1.2 MiB, grads ..., activations ... (peak)": peak bytes of every category used.
std::string format_peak_memory(const MemorySnapshot& s);

}  // namespace stateflow
