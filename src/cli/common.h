// Options shared by several commands: model selection, precision and data.
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "model/config.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "train/planner.h"

namespace stateflow::cli {

struct ModelOptions {
  std::string preset;
  std::string config_path;
  std::string pattern;
  std::string dtype;
  std::string device = "cpu";
  void add(CLI::App& app, const std::string& default_preset, const std::string& default_dtype);
  ModelConfig resolve() const;  // --config wins over --preset; --pattern over both
  // Whether the model's vocab_size is the user's (a --config file that sets it); otherwise the
  // vocabulary follows the data (apply_common_options).
  bool vocab_fixed() const;
  Device resolve_device() const;  // parses --device and starts its backend
};

// Pipeline shape shared by train, verify and bench.
struct PipelineOptions {
  int stages = 1;
  int microbatches = 1;
  int64_t chunks = 1;
  bool chunks_auto = false;       // --chunks auto: the planner chooses N and the partition
  std::string chunk_lengths;      // a,b,c or a plan file
  int64_t chunk_multiple = 0;     // --chunks auto: cuts on multiples of this (0: the device's default)
  std::string profile_dir;        // --chunks auto: where cost profiles are cached
  std::string cost_profile;       // --chunks auto: a recorded profile instead
  std::string schedule = "stateflow";
  std::string transport = "auto";
  double timeout_s = 120;
  // One process per GPU (NCCL): this process's rank, when no launcher's variables give it.
  int rank = -1, world_size = -1, local_rank = -1;
  std::string rendezvous;
  std::string recompute = "none";
  bool sm_split = false;  // --sm-split
  void add(CLI::App& app, bool with_chunks = true);
  bool recompute_full() const;  // validates --recompute
  void apply_launch_flags() const;  // hands --rank, --world-size, --local-rank, --rendezvous to launch
  // --chunk-lengths if given, else --chunks nearly-equal chunks of seq_len.
  std::vector<int64_t> resolve_chunks(int64_t seq_len) const;
  // The lengths of --chunk-lengths (checked for form, not against a seq_len); empty when not given.
  std::vector<int64_t> given_chunk_lengths() const;
  // --chunks auto: the planner's space for a run of this shape (its schedule, M and recompute
  // fixed; N and the partition free). Throws Error in a multi-process launch (each process
  // would measure, and might choose, on its own).
  PlanSpace auto_chunk_space(const ModelConfig& m, DType dtype, Device device, int64_t batch, int64_t seq_len,
                             bool recompute, double memory_bytes) const;
};

// --data-parallel D (train and verify): replicas of the pipeline, one process per rank.
void add_data_parallel_option(CLI::App& app, int& data_parallel);

struct DataOptions {
  DataConfig data;
  void add(CLI::App& app);
};

// --resume (and --device) of the commands that use a trained model: eval, generate, export.
struct CheckpointOptions {
  std::string resume;
  std::string device = "cpu";
  void add(CLI::App& app, bool with_device);
  LoadedModel load() const;  // the checkpoint's whole model, on --device
};

// Copies what train, verify and bench share (model, precision, device, data, pipeline shape)
// into their option struct. A preset's vocabulary is the data's (text: 256, a token manifest:
// its tokenizer's) unless the --config file sets vocab_size.
template <class Options>
void apply_common_options(Options& o, const ModelOptions& m, const DataOptions& d, const PipelineOptions& p) {
  o.model = m.resolve();
  if (!m.vocab_fixed())
    if (int64_t v = data_vocab_size(d.data)) o.model.vocab_size = v;
  o.dtype = parse_dtype(m.dtype);
  o.device = m.resolve_device();
  o.data = d.data;
  o.stages = p.stages, o.microbatches = p.microbatches;
  o.transport = p.transport, o.timeout_s = p.timeout_s, o.recompute = p.recompute_full();
  o.split_sms = p.sm_split;
  p.apply_launch_flags();
}

}  // namespace stateflow::cli
