// Hugging Face checkpoints of flash-linear-attention's GatedDeltaNetForCausalLM (fla's
// `gated_deltanet` model type): a folder with config.json and model.safetensors (or shards
// listed in model.safetensors.index.json). Export writes one that fla loads with
// transformers; import reads one into a stateflow model. The mapping of config fields and of
// tensor names and layouts is in hf_format.cpp, in one table each; what cannot map is refused
// with the reason.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "model/model.h"

namespace stateflow {

// fla's config.json for this model; throws when fla cannot express it.
nlohmann::json hf_config_of(const ModelConfig& c);
// The model config of an fla config.json; throws naming the field when stateflow's model
// cannot run it (hybrid attention layers, grouped value heads, no output gate, ...).
ModelConfig model_config_of_hf(const nlohmann::json& j, const std::string& what);
// Reads DIR/config.json.
nlohmann::json read_hf_config(const std::string& dir);

// Writes DIR/config.json and DIR/model.safetensors (f32, whatever the model's dtype) from a
// model that holds all its layers (on the CPU).
void export_hf(Model& model, const std::string& dir);
// Loads every weight of the model (all its layers, on the CPU) from DIR's safetensors (F32,
// BF16 or F64 tensors); every tensor there must have a place in the model.
void load_hf_weights(Model& model, const std::string& dir);

}  // namespace stateflow
