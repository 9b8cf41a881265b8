#include "model/model.h"

#include "core/rng.h"
#include "model/embedding_layer.h"
#include "model/gdn_layer.h"
#include "model/lm_head.h"
#include "model/mlp_layer.h"
#include "model/residual.h"

namespace stateflow {

Model::Model(const ModelConfig& cfg, DType dtype) : cfg_(cfg), dtype_(dtype) {
  cfg_.validate();
  CategoryScope weights(MemCategory::Weights);
  // Every layer draws from its own stream, so a layer's initial weights do not depend on
  // how many layers came before it or on the dtype.
  uint64_t stream = 0;
  Rng rng = Rng::derive(cfg.seed, stream++);
  layers_.push_back(std::make_unique<Embedding>(cfg_, dtype, rng));
  for (int64_t i = 0; i < cfg.n_layers; ++i) {
    std::string p = "blocks." + std::to_string(i);
    Rng r1 = Rng::derive(cfg.seed, stream++);
    layers_.push_back(std::make_unique<PreNormResidual>(
        p + ".mixer", cfg_, dtype, std::make_unique<GatedDeltaNet>(p + ".mixer", cfg_, dtype, r1)));
    Rng r2 = Rng::derive(cfg.seed, stream++);
    layers_.push_back(std::make_unique<PreNormResidual>(p + ".mlp", cfg_, dtype,
                                                        std::make_unique<SwiGluMlp>(p + ".mlp", cfg_, dtype, r2)));
  }
  Rng rh = Rng::derive(cfg.seed, stream++);
  layers_.push_back(std::make_unique<LmHead>(cfg_, dtype, rh));
}

std::vector<Layer*> Model::layers(int begin, int end) {
  SF_CHECK(0 <= begin && begin <= end && end <= num_layers(), "layer range [", begin, ", ", end,
           ") out of range for a model of ", num_layers(), " layers");
  std::vector<Layer*> out;
  for (int i = begin; i < end; ++i) out.push_back(layers_[i].get());
  return out;
}

std::vector<Param*> Model::params(int begin, int end) {
  std::vector<Param*> out;
  for (Layer* l : layers(begin, end))
    for (Param* p : l->params()) out.push_back(p);
  return out;
}

void Model::copy_weights_from(Model& other) {
  auto mine = params(), theirs = other.params();
  SF_CHECK(mine.size() == theirs.size(), "copy_weights_from: models differ in parameter count");
  for (size_t i = 0; i < mine.size(); ++i) {
    SF_CHECK(mine[i]->value.shape() == theirs[i]->value.shape(), "copy_weights_from: shape of ", mine[i]->name,
             " differs");
    mine[i]->value.copy_from(theirs[i]->value.to(dtype_));
  }
}

}  // namespace stateflow
