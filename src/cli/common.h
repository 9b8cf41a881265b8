// Options shared by several commands: model selection, precision and data.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

#include "model/config.h"
#include "train/data.h"

namespace stateflow::cli {

struct ModelOptions {
  std::string preset;
  std::string config_path;
  std::string dtype;
  void add(CLI::App& app, const std::string& default_preset, const std::string& default_dtype);
  ModelConfig resolve() const;  // --config wins over --preset
};

struct DataOptions {
  DataConfig data;
  void add(CLI::App& app);
};

}  // namespace stateflow::cli
