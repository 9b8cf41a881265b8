#include "model/model.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>

#include "core/rng.h"
#include "model/device_ops.h"
#include "model/embedding_layer.h"
#include "model/lm_head.h"
#include "model/mixer.h"
#include "model/mlp_layer.h"
#include "model/residual.h"

namespace stateflow {

// Layer i of the flat list, its weights drawn from its own random stream.
static std::unique_ptr<Layer> build_layer(const ModelConfig& cfg, DType dtype, int i) {
  Rng rng = Rng::derive(cfg.seed, static_cast<uint64_t>(i));
  const int n = Model::num_layers_of(cfg);
  if (i == 0) return std::make_unique<Embedding>(cfg, dtype, rng);
  if (i == n - 1) return std::make_unique<LmHead>(cfg, dtype, rng);
  const int block = (i - 1) / 2;
  const std::string p = cat("blocks.", block);
  if ((i - 1) % 2 == 0) {
    const Mixer& mixer = mixer_for_letter(cfg.blocks()[block]);
    return std::make_unique<PreNormResidual>(p + ".mixer", cfg, dtype, mixer.make_layer(p + ".mixer", cfg, dtype, rng));
  }
  return std::make_unique<PreNormResidual>(p + ".mlp", cfg, dtype,
                                           std::make_unique<SwiGluMlp>(p + ".mlp", cfg, dtype, rng));
}

Model::Model(const ModelConfig& cfg, DType dtype, int begin, int end, Device device)
    : cfg_(cfg), dtype_(dtype), device_(device), begin_(begin), end_(end) {
  cfg_.validate();
  for (char letter : cfg_.blocks()) {
    const Mixer& m = mixer_for_letter(letter);
    if (m.check_device) m.check_device(cfg_, device);
  }
  const int n = num_layers_of(cfg_);
  SF_CHECK(0 <= begin && begin < end && end <= n, "layer range [", begin, ", ", end, ") out of range for a model of ",
           n, " layers");
  layers_.resize(n);
  // Drawing a 1.3B model's normals takes a minute on one core. Each layer has its own random
  // stream, so building layers on several threads gives the weights one thread would; the two
  // big ones (embedding, LM head) go first so that neither is left alone at the end.
  std::vector<int> order;
  for (int i = begin; i < end; ++i)
    if (i == 0 || i == n - 1) order.push_back(i);
  for (int i = begin; i < end; ++i)
    if (i != 0 && i != n - 1) order.push_back(i);
  const int n_threads = static_cast<int>(std::clamp<unsigned>(std::thread::hardware_concurrency(), 1, order.size()));
  MemoryTracker& tracker = current_tracker();  // the builders charge the caller's tracker
  std::atomic<size_t> next{0};
  std::mutex error_mutex;
  std::exception_ptr error;
  auto build = [&] {
    TrackerScope track(tracker);
    CategoryScope weights(MemCategory::Weights);
    std::optional<GradsAtPlacement> device_grads;  // made by move_param_to below, on the device only
    if (device != Device::CPU) device_grads.emplace();
    for (size_t k; (k = next++) < order.size();) {
      try {
        layers_[order[k]] = build_layer(cfg_, dtype, order[k]);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
    }
  };
  std::vector<std::thread> helpers;
  for (int t = 1; t < n_threads; ++t) helpers.emplace_back(build);
  build();
  for (std::thread& h : helpers) h.join();
  if (error) std::rethrow_exception(error);
  for (Param* p : params()) move_param_to(*p, device);
  if (device != Device::CPU)
    for (Layer* l : layers()) share_bf16_copies(l->params());
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
