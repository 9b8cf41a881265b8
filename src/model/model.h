// The model as a flat list of layers, in execution order:
//   0: embedding,  then per block i: mixer block (2i+1) and MLP block (2i+2),  last: LM head;
// block i's mixer is the one its letter in the config's layer pattern names (model/mixer.h).
// A pipeline stage owns a contiguous range of this list and builds only those layers; each
// layer draws its initial weights from its own random stream, so a layer's weights are the
// same whichever stage (thread or process) builds it.
#pragma once
#include <memory>
#include <vector>

#include "model/config.h"
#include "model/layer.h"

namespace stateflow {

class Model {
 public:
  Model(const ModelConfig& cfg, DType dtype) : Model(cfg, dtype, 0, num_layers_of(cfg)) {}
  // Builds only layers [begin, end); the others are absent. On the GPU the weights are those
  // the CPU would build (made on the host, then moved), dtype is the master-weight type (f32),
  // and the layers run their GPU paths with bf16 activations.
  Model(const ModelConfig& cfg, DType dtype, int begin, int end, Device device = Device::CPU);
  static int num_layers_of(const ModelConfig& cfg) { return static_cast<int>(2 * cfg.num_blocks() + 2); }
  const ModelConfig& config() const { return cfg_; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  int num_layers() const { return static_cast<int>(layers_.size()); }
  int begin() const { return begin_; }
  int end() const { return end_; }
  std::vector<Layer*> layers(int begin, int end);
  std::vector<Layer*> layers() { return layers(begin_, end_); }
  std::vector<Param*> params(int begin, int end);
  std::vector<Param*> params() { return params(begin_, end_); }
  // The parameter with this name, or nullptr.
  Param* find_param(const std::string& name);

 private:
  ModelConfig cfg_;
  DType dtype_;
  Device device_;
  int begin_, end_;
  std::vector<std::unique_ptr<Layer>> layers_;
};

}  // namespace stateflow
