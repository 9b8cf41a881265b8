// The training loop: batches from a DataSource, a pipeline of P stages (one stage is the
// plain case) running the chosen schedule over microbatches and chunks, global gradient
// clipping, AdamW with warmup + cosine learning rate, progress lines, checkpoints
// (docs/checkpoints.md), and a clean stop with a checkpoint on SIGINT/SIGTERM.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "pipeline/pipeline.h"
#include "train/chunk_tuner.h"
#include "train/data.h"
#include "train/evaluate.h"
#include "train/train_options.h"

namespace stateflow {

struct StepReport {
  int64_t step = 0;  // counted from 0
  double loss = 0, accuracy = 0, grad_norm = 0, lr = 0, seconds = 0, bubble_fraction = 0;
  int64_t tokens = 0;
  bool skipped = false;  // non-finite loss or gradient under --skip-nonfinite: no update
  std::string warning;   // why it was skipped
  std::string tuning;      // --chunks auto: what the chunk tuner measured and decided after this step
  bool evaluated = false;  // held-out evaluation ran after this step
  EvalResult eval;
};

class Trainer {
 public:
  // Builds the data source and the pipeline; with opts.resume, loads that checkpoint.
  explicit Trainer(const TrainOptions& opts);
  // One optimizer step. A NaN/Inf loss or gradient throws an Error naming the step and the
  // first parameter (in backward order) with a non-finite gradient, or, with
  // skip_nonfinite, skips the update and says so in the report.
  StepReport step();
  // Runs the remaining steps up to opts.steps, printing progress every log_every steps to
  // `log` (rank 0 only), saving checkpoints as the options say. Stops early after the step
  // in progress when SIGINT or SIGTERM arrives (see stop_signal.h): saves, then returns
  // with stopped_by() set.
  std::vector<StepReport> run(std::ostream& log);

  // --chunks auto: tune the partition online from the next steps' measured times (chunk_tuner.h).
  void enable_chunk_tuning(AutoChunks chosen, int rounds = 3, double min_gain = 0.02);

  // Loss, perplexity and accuracy on the first opts.eval_tokens of opts.eval_data, chunk by
  // chunk through the stages' layers (run() does it every eval_every steps and at the end).
  EvalResult evaluate_held_out();

  // Writes a checkpoint of the current state into opts.save_dir; returns its directory.
  std::string save_checkpoint();
  // Restores weights, optimizer state, step, data position from a save dir (its newest
  // complete checkpoint) or a step directory. The pipeline shape may differ from the run
  // that saved it, and so may the device (an f32 checkpoint moves between CPU and GPU); the
  // model and dtype must not.
  void load_checkpoint(const std::string& path);

  Pipeline& pipeline() { return *pipeline_; }
  const TrainOptions& options() const { return opts_; }
  int64_t steps_done() const { return step_; }
  int64_t skipped_steps() const { return skipped_; }
  int stopped_by() const { return stopped_by_; }  // the signal that stopped run(), or 0

 private:
  TrainOptions opts_;
  std::unique_ptr<DataSource> data_;
  std::unique_ptr<DataSource> eval_data_;  // none without opts.eval_data
  std::unique_ptr<Pipeline> pipeline_;
  std::unique_ptr<ChunkTuner> tuner_;  // --chunks auto only
  PipelineStepResult last_;
  int64_t step_ = 0;
  int64_t skipped_ = 0;
  int64_t last_saved_step_ = -1;
  int stopped_by_ = 0;
};

// "weights 1.2 MiB, grads ..., activations ... | total ...": peak bytes of each category used.
std::string format_peak_memory(const MemorySnapshot& s);

}  // namespace stateflow
