// The mixer registry: one row per sequence mixer (Gated DeltaNet, ...), and everything the rest
// of the system asks of a mixer goes through its row: config section, building the layer,
// parameter count, FLOPs, stash and boundary-state sizes. A mixer lives in its own folder
// src/mixers/<name>/ and registers itself there with one line:
//
//   static const MixerRegistration registered(make_gdn_mixer());
//
// Its GPU path, when it has one, registers itself from its CUDA file (model/device_path.h), so
// a CPU-only build needs nothing in its place. docs/design.md, "How to add a mixer".
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "model/config.h"
#include "model/layer.h"

namespace stateflow {

// One tensor of a mixer's boundary state, per sequence (the batch dimension comes first).
struct StateTensorSpec {
  std::string name;
  Shape shape;              // without the batch dimension; a growing state's: one token's row
  DType device_dtype;       // its type on the GPU (on the CPU it is the run's dtype)
  // An attention K/V prefix: [seq_len, shape...] per sequence, rows filled up to the chunk's end.
  bool grows_with_chunks;
};

// Per token of one block's mixer; a multiply-add is 2 FLOPs (MATH.md section 9).
struct MixerFlops {
  double dense_forward = 0, dense_backward = 0;  // weight matrices: 2 and 4 per weight
  double core_forward = 0, core_backward = 0;    // the sequence core (recurrence), per token
  // Per (token, key it attends to): softmax attention's core, which grows with the prefix.
  double core_forward_per_key = 0, core_backward_per_key = 0;
};

struct Mixer {
  char letter;               // in the layer pattern
  std::string name;          // config section, layer kind, docs: "gdn"
  std::string description;   // one line for help text and errors
  nlohmann::json defaults;   // the config section's defaults (the tiny preset's sizes)
  // Throws Error naming "<name>.<field>" when the (complete) section is invalid for this model.
  void (*validate)(const ModelConfig& cfg);
  std::unique_ptr<Layer> (*make_layer)(const std::string& prefix, const ModelConfig& cfg, DType dtype, Rng& rng);
  int64_t (*num_parameters)(const ModelConfig& cfg);
  MixerFlops (*flops_per_token)(const ModelConfig& cfg);
  // Values per token of the main tensors its forward saves for the backward: the depth
  // predictions scale a measured stash to another model by it.
  double (*activation_width)(const ModelConfig& cfg);
  std::vector<StateTensorSpec> (*boundary_state)(const ModelConfig& cfg);
  // Token multiple of the kernel's inner block (tests cut chunks that don't divide it); 1 if none.
  int64_t (*inner_block)(const ModelConfig& cfg);
  // Fields of the section that choose how a device runs the mixer, not what it computes or which
  // parameters it has (GDN's keep_sweep: memory for time, same results): a checkpoint resumes
  // with other values of them (train/checkpoint.h, model_differences).
  std::vector<std::string> settings;
  // Optional: throws Error naming the fields when the device's kernels cannot run the section's
  // sizes (e.g. the GDN CUDA core's heads of 128), before any weight is drawn. Host code, so a
  // CPU build tests the message too.
  void (*check_device)(const ModelConfig& cfg, Device device) = nullptr;
};

// Adds a row at start-up; two rows with one letter or name are an error at start-up.
struct MixerRegistration {
  explicit MixerRegistration(Mixer m);
};

// Throws Error listing the known letters.
const Mixer& mixer_for_letter(char letter);
// nullptr when no mixer has this name.
const Mixer* find_mixer(const std::string& name);
// Every registered mixer, by letter.
std::vector<const Mixer*> all_mixers();
// The largest inner block of the model's mixers (chunkings that don't divide it test the edges).
int64_t largest_inner_block(const ModelConfig& cfg);
// "G = gdn (Gated DeltaNet), S = ..." for help text and errors.
std::string mixer_letters_help();

// Reads a field of a mixer's config section, checked: "gdn.heads = 0 is out of range; accepted: 1..1024".
int64_t section_int(const ModelConfig& cfg, const std::string& mixer, const char* field, int64_t lo, int64_t hi);
double section_number(const ModelConfig& cfg, const std::string& mixer, const char* field, double lo, double hi);
bool section_flag(const ModelConfig& cfg, const std::string& mixer, const char* field);

}  // namespace stateflow
