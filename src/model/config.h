// Model configuration and named presets. A model is Embedding -> n_layers x [GDN block, MLP
// block] -> final RMSNorm -> LM head, with the sizes below (MATH.md section 2 names).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace stateflow {

struct ModelConfig {
  std::string name = "custom";
  int64_t vocab_size = 64;
  int64_t d_model = 32;
  int64_t n_layers = 2;
  int64_t n_heads = 2;      // GDN heads (q/k and value heads alike)
  int64_t head_dk = 8;      // key/query head size
  int64_t head_dv = 8;      // value head size
  int64_t conv_size = 4;    // short conv kernel K
  int64_t block_size = 8;   // inner sub-chunk size C of the chunkwise GDN kernel
  int64_t mlp_hidden = 64;  // SwiGLU width F
  double norm_eps = 1e-5;
  double init_std = 0.02;
  uint64_t seed = 1234;     // weight initialisation
  // Optional stage cuts: one 'G' per GDN block, '|' between pipeline stages (e.g. "GGG|G").
  // Empty: blocks are spread evenly over the stages.
  std::string stage_pattern;

  // Throws stateflow::Error naming the first invalid field and its accepted range.
  void validate() const;
  nlohmann::json to_json() const;
  static ModelConfig from_json(const nlohmann::json& j);  // unknown keys are an error
  int64_t num_parameters() const;
};

// "tiny" (tests, verify), "small" (the demo), "gdn-1.3b" (GPU benchmarks; 1.47 B parameters),
// "gdn-3b", "gdn-7b", "gdn-14b" (the same shape scaled: 2.95, 7.39, 14.24 B).
ModelConfig model_preset(const std::string& name);
std::vector<std::string> model_preset_names();
// Reads a JSON file: either a full config, or {"preset": "...", ...overrides}.
ModelConfig load_model_config(const std::string& path);

}  // namespace stateflow
