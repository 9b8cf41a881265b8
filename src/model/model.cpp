#include "model/model.h"

#include "core/rng.h"
#include "model/embedding_layer.h"
#include "model/gdn_layer.h"
#include "model/lm_head.h"
#include "model/mlp_layer.h"
#include "model/residual.h"

namespace stateflow {

Model::Model(const ModelConfig& cfg, DType dtype, int begin, int end, Device device)
    : cfg_(cfg), dtype_(dtype), device_(device), begin_(begin), end_(end) {
  cfg_.validate();
  const int n = num_layers_of(cfg_);
  SF_CHECK(0 <= begin && begin < end && end <= n, "layer range [", begin, ", ", end, ") out of range for a model of ",
           n, " layers");
  CategoryScope weights(MemCategory::Weights);
  layers_.resize(n);
  for (int i = begin; i < end; ++i) {
    Rng rng = Rng::derive(cfg_.seed, static_cast<uint64_t>(i));
    if (i == 0) {
      layers_[i] = std::make_unique<Embedding>(cfg_, dtype, rng);
    } else if (i == n - 1) {
      layers_[i] = std::make_unique<LmHead>(cfg_, dtype, rng);
    } else {
      const std::string p = cat("blocks.", (i - 1) / 2);
      if ((i - 1) % 2 == 0)
        layers_[i] = std::make_unique<PreNormResidual>(
            p + ".mixer", cfg_, dtype, std::make_unique<GatedDeltaNet>(p + ".mixer", cfg_, dtype, rng));
      else
        layers_[i] = std::make_unique<PreNormResidual>(p + ".mlp", cfg_, dtype,
                                                       std::make_unique<SwiGluMlp>(p + ".mlp", cfg_, dtype, rng));
    }
  }
  for (Param* p : params()) move_param_to(*p, device);
}

std::vector<Layer*> Model::layers(int begin, int end) {
  SF_CHECK(begin_ <= begin && begin <= end && end <= end_, "layers [", begin, ", ", end,
           ") are not all built here: this model part holds layers [", begin_, ", ", end_, ")");
  std::vector<Layer*> out;
  for (int i = begin; i < end; ++i) out.push_back(layers_[i].get());
  return out;
}

Param* Model::find_param(const std::string& name) {
  for (Param* p : params())
    if (p->name == name) return p;
  return nullptr;
}

std::vector<Param*> Model::params(int begin, int end) {
  std::vector<Param*> out;
  for (Layer* l : layers(begin, end))
    for (Param* p : l->params()) out.push_back(p);
  return out;
}

}  // namespace stateflow
