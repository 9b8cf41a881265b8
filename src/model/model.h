// The model as a flat list of layers, in execution order:
//   0: embedding,  then per block i: GDN block (2i+1) and MLP block (2i+2),  last: LM head.
// A pipeline stage owns a contiguous range of this list.
#pragma once
#include <memory>
#include <vector>

#include "model/config.h"
#include "model/layer.h"

namespace stateflow {

class Model {
 public:
  Model(const ModelConfig& cfg, DType dtype);
  const ModelConfig& config() const { return cfg_; }
  DType dtype() const { return dtype_; }
  int num_layers() const { return static_cast<int>(layers_.size()); }
  Layer& layer(int i) { return *layers_.at(i); }
  std::vector<Layer*> layers(int begin, int end);
  std::vector<Layer*> layers() { return layers(0, num_layers()); }
  std::vector<Param*> params(int begin, int end);
  std::vector<Param*> params() { return params(0, num_layers()); }
  // Copies every parameter value from `other` (same config; dtypes may differ).
  void copy_weights_from(Model& other);

 private:
  ModelConfig cfg_;
  DType dtype_;
  std::vector<std::unique_ptr<Layer>> layers_;
};

}  // namespace stateflow
