// Model configuration and named presets. A model is Embedding -> blocks -> final RMSNorm -> LM
// head; each block is a sequence mixer + a SwiGLU MLP, and the layer pattern names the mixer of
// every block with one letter (the registry in model/mixer.h: G = Gated DeltaNet, ...). Each
// mixer's own sizes live in its config section, keyed by the mixer's name ("gdn": {...}).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace stateflow {

struct ModelConfig {
  std::string name = "custom";
  int64_t vocab_size = 64;
  int64_t d_model = 32;
  int64_t mlp_hidden = 64;  // SwiGLU width F
  double norm_eps = 1e-5;
  double init_std = 0.02;
  uint64_t seed = 1234;     // weight initialisation
  // One letter per block, '|' where a pipeline stage ends: "GGGA|GGGA". Without '|' the
  // blocks are cut into stages evenly by cost (pipeline/partition.h).
  std::string pattern = "GG";
  // Each mixer's section by mixer name, complete (defaults filled in) for every mixer the
  // pattern uses and for no other.
  nlohmann::json mixers = nlohmann::json::object();

  // The block letters without the stage cuts.
  std::string blocks() const;
  int64_t num_blocks() const { return static_cast<int64_t>(blocks().size()); }
  bool has_stage_cuts() const { return pattern.find('|') != std::string::npos; }
  // This mixer's section ({} when the pattern does not use it).
  const nlohmann::json& section(const std::string& mixer) const;

  // Fills in the sections of the pattern's mixers from their defaults and drops the others;
  // call after changing `pattern`. validate() and from_json() do it too.
  void complete_sections();
  // Throws stateflow::Error naming the first invalid field and its accepted range.
  void validate() const;
  nlohmann::json to_json() const;
  static ModelConfig from_json(const nlohmann::json& j);  // unknown keys are an error
  int64_t num_parameters() const;
};

// "tiny" (tests, verify), "small" (the demo), "small-grouped" (the demo with two value heads per
// q/k head, as Qwen3.5's GDN), "gdn-1.3b" (GPU benchmarks; 1.47 B parameters),
// "gdn-3b", "gdn-7b", "gdn-14b" (the same shape scaled: 2.95, 7.39, 14.24 B); "mamba3-small"
// (the demo with Mamba-3 blocks), "mamba3-1.3b" and "gdn-mamba3-1.3b" (GDN and Mamba-3 alternating);
// "hybrid-1.3b", "hybrid-3b", "hybrid-7b": the GDN models with every fourth block softmax attention.
ModelConfig model_preset(const std::string& name);
std::vector<std::string> model_preset_names();
// Reads a JSON file: either a full config, or {"preset": "...", ...overrides}.
ModelConfig load_model_config(const std::string& path);
// The preset or config file, then a layer pattern that replaces the config's (empty: keep it).
ModelConfig resolve_model_config(const std::string& preset, const std::string& config_path,
                                 const std::string& pattern);

}  // namespace stateflow
