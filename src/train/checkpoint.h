// Checkpoints of a pipelined run (layout and guarantees: docs/checkpoints.md).
//
//   SAVE_DIR/step-000100/stage-0-of-2.safetensors   one file per pipeline stage: its weights
//   SAVE_DIR/step-000100/stage-1-of-2.safetensors   by param name, AdamW's m and v as
//                                                   "optim.m.<name>" / "optim.v.<name>"
//   SAVE_DIR/step-000100/manifest.json              written last: the step, the data position,
//                                                   the run's options, each file's size and CRC-32
//
// Every file is written atomically, so a directory with a manifest is complete. Loading
// matches parameters by name, so a checkpoint resumes under any stage split and chunking. Under
// data parallelism replica 0 writes the files (all replicas hold the same state) and every
// replica reads them, so a run resumes under any number of replicas too.
// GPU runs write and read the same files: their fp32 masters and moments go through host
// copies, and their bf16 GEMM copies are re-cast from the masters after loading.
#pragma once
#include <cstdint>
#include <memory>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/file_io.h"
#include "pipeline/pipeline.h"

namespace stateflow {

// The trainer's state besides the tensors.
struct CheckpointState {
  int64_t step = 0;            // steps done (skipped ones included): the LR schedule's position
  int64_t skipped_steps = 0;   // steps skipped for a non-finite loss or gradient
  uint64_t data_position = 0;  // DataSource::position() before the next step
  nlohmann::json options;      // the run's TrainOptions::to_json()
};

constexpr const char* kCheckpointFormat = "stateflow-checkpoint";
constexpr int kCheckpointVersion = 1;

std::string checkpoint_dir_name(int64_t step);                 // "step-000100"
std::string stage_file_name(int stage, int stages);            // "stage-0-of-2.safetensors"

// Saves every stage this process runs, and on the reporting process the manifest; then
// removes all but the newest `keep` checkpoints of save_dir (keep 0: none). Every process
// of the run calls it. Returns the step directory.
std::string save_checkpoint(Pipeline& pipeline, const std::string& save_dir, const CheckpointState& state, int keep);

// A step directory (it has a manifest) as is; a save dir: its newest complete checkpoint.
std::string find_checkpoint(const std::string& path);
// The save dir that holds a step directory, as an absolute path: a bare relative name
// ("step-000400", "step-000400/") is in the current directory.
std::string save_dir_of(const std::string& step_dir);

// The fields in which two model configs differ, ignoring the name, the stage cuts of the layer
// pattern and the mixers' settings (Mixer::settings; none changes the math or the parameters):
// "d_model 24 vs 32, ..."; empty when they agree.
std::string model_differences(const ModelConfig& a, const ModelConfig& b);

// The manifest of a step directory, checked for form (not yet against the files).
struct CheckpointManifest {
  struct File {
    std::string name;
    FileDigest digest;
  };
  CheckpointState state;
  std::vector<File> files;  // by stage
};
CheckpointManifest read_manifest(const std::string& step_dir);
// Writes it atomically as step_dir/manifest.json.
void write_manifest(const std::string& step_dir, const CheckpointManifest& m);

// Verifies every file against the manifest (size, CRC-32, the same step, model and dtype,
// stage layer ranges that tile the model, each parameter in exactly one file) and the
// model and dtype against the pipeline's, then loads each local stage's weights and
// optimizer state by parameter name. Every process of the run calls it.
CheckpointState load_checkpoint(Pipeline& pipeline, const std::string& step_dir);

// Every tensor of a checkpoint by name, on the host: the weights and AdamW's moments
// ("optim.m.<name>", "optim.v.<name>"), checked as load_checkpoint checks them, but without
// building a model (for tools that compare or inspect checkpoints).
std::map<std::string, Tensor> read_checkpoint_tensors(const std::string& step_dir);

// A checkpoint's whole model, for inference (eval, generate, export): built on `device` from
// the checkpoint's model config and dtype, its weights loaded after the same checks as
// load_checkpoint (no optimizer state). `path` is a save dir or a step directory.
struct LoadedModel {
  std::string step_dir;
  CheckpointState state;  // state.options: the run's TrainOptions::to_json()
  std::unique_ptr<Model> model;
};
LoadedModel load_model_from_checkpoint(const std::string& path, Device device = Device::CPU);

}  // namespace stateflow
