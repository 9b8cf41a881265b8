// Everything a training run is configured by, its validation, and its JSON form (a
// checkpoint records it, and a resumed run starts from it).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "pipeline/stage.h"
#include "train/data.h"

namespace stateflow {

struct TrainOptions {
  ModelConfig model = model_preset("small");
  DType dtype = DType::F32;
  Device device = Device::CPU;
  DataConfig data;
  // Defaults: the CPU demo, which learns associative recall in a few minutes on 2 cores.
  int64_t steps = 500;  // total optimizer steps of the run (a resumed run continues up to it)
  int64_t batch = 16;   // sequences per step
  int64_t seq_len = 128;
  int stages = 2;
  int data_parallel = 0;   // replicas (0: the launch's world size / stages); never taken from a checkpoint
  double bucket_mb = 25;   // data parallelism: gradient bucket size in MiB
  int microbatches = 2;
  int64_t chunks = 4;                  // used when chunk_lengths is empty
  std::vector<int64_t> chunk_lengths;  // explicit cut, must sum to seq_len
  std::string schedule = "stateflow";
  std::string transport = "local";
  double timeout_s = 120;
  bool split_sms = false;  // --sm-split (PipelineConfig::split_sms)
  bool recompute = false;  // full per-layer activation recomputation
  double lr = 3e-3, min_lr = 3e-4;
  int64_t warmup = 20;
  AdamWConfig adamw;
  double clip = 1.0;
  int64_t log_every = 25;
  std::string trace_path;    // Chrome trace of the last step's executed timeline
  std::string metrics_path;  // CSV, one line per step (appended to when resuming)
  // Checkpoints (docs/checkpoints.md).
  std::string save_dir;        // empty: never save
  int64_t save_every = 0;      // save every this many steps (0: only at the end and on SIGINT/SIGTERM)
  int64_t keep = 3;            // keep the newest this many checkpoints (0: keep all)
  std::string resume;          // a save dir (its newest checkpoint) or one step directory
  bool skip_nonfinite = false; // skip steps whose loss or gradient is NaN/Inf instead of stopping
  // Held-out evaluation (train/evaluate.h): eval_data.kind empty = none. Every eval_every steps
  // (0: only at the end), on the first eval_tokens tokens of eval_data, in batches of
  // batch x seq_len cut into this run's chunks.
  DataConfig eval_data{"", "", 0, 0, {}};
  int64_t eval_every = 0;
  int64_t eval_tokens = 8192;

  std::vector<int64_t> resolved_chunk_lengths() const;
  PipelineConfig pipeline_config() const;
  void validate() const;  // throws Error naming the bad option
  nlohmann::json to_json() const;
  static TrainOptions from_json(const nlohmann::json& j);  // unknown keys are an error; validates
};

}  // namespace stateflow
