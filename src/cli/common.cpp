#include "cli/common.h"

namespace stateflow::cli {

void ModelOptions::add(CLI::App& app, const std::string& default_preset, const std::string& default_dtype) {
  preset = default_preset;
  dtype = default_dtype;
  std::string names;
  for (auto& n : model_preset_names()) names += (names.empty() ? "" : ", ") + n;
  app.add_option("--preset", preset, "Model preset: " + names)->capture_default_str();
  app.add_option("--config", config_path,
                 "Model config JSON file (a full config, or {\"preset\": ..., overrides}); wins over --preset");
  app.add_option("--dtype", dtype, "Precision of weights and arithmetic: f32 or f64")->capture_default_str();
}

ModelConfig ModelOptions::resolve() const {
  return config_path.empty() ? model_preset(preset) : load_model_config(config_path);
}

void DataOptions::add(CLI::App& app) {
  app.add_option("--data", data.kind,
                 "Training data: recall (built-in associative recall task), text (a file read as bytes), "
                 "tokens-u16 or tokens-u32 (binary token files)")
      ->capture_default_str();
  app.add_option("--data-path", data.path, "File for --data text|tokens-u16|tokens-u32");
  app.add_option("--data-vocab", data.vocab_size,
                 "Vocabulary of the data (0: the model's vocab for recall, 256 for text); token files need it");
  app.add_option("--data-seed", data.seed, "Seed of the recall task's generator")->capture_default_str();
  app.add_option("--recall-pairs", data.recall.num_pairs, "Recall task: key-value pairs per sequence")
      ->capture_default_str();
  app.add_option("--recall-queries", data.recall.num_queries, "Recall task: queries per sequence")
      ->capture_default_str();
}

}  // namespace stateflow::cli
