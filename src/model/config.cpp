#include "model/config.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace stateflow {

void ModelConfig::validate() const {
  auto positive = [](const char* field, int64_t v, int64_t max) {
    SF_CHECK(v >= 1 && v <= max, "model config: ", field, " = ", v, " is out of range; accepted: 1..", max);
  };
  positive("vocab_size", vocab_size, int64_t(1) << 30);
  positive("d_model", d_model, 1 << 16);
  positive("n_layers", n_layers, 1024);
  positive("n_heads", n_heads, 1024);
  positive("head_dk", head_dk, 1024);
  positive("head_dv", head_dv, 1024);
  positive("conv_size", conv_size, 64);
  positive("block_size", block_size, 1024);
  positive("mlp_hidden", mlp_hidden, 1 << 20);
  SF_CHECK(norm_eps > 0 && norm_eps < 1, "model config: norm_eps = ", norm_eps, " must be in (0, 1)");
  SF_CHECK(init_std > 0 && init_std < 10, "model config: init_std = ", init_std, " must be in (0, 10)");
}

nlohmann::json ModelConfig::to_json() const {
  return {{"name", name},           {"vocab_size", vocab_size}, {"d_model", d_model},
          {"n_layers", n_layers},   {"n_heads", n_heads},       {"head_dk", head_dk},
          {"head_dv", head_dv},     {"conv_size", conv_size},   {"block_size", block_size},
          {"mlp_hidden", mlp_hidden}, {"norm_eps", norm_eps},   {"init_std", init_std},
          {"seed", seed},           {"stage_pattern", stage_pattern}};
}

static void apply_json(ModelConfig& c, const nlohmann::json& j) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    const nlohmann::json& v = it.value();
    // Checked before get<>(): a float read as an integer would be truncated, or be undefined
    // behaviour when out of range.
    auto expect = [&](bool ok, const char* type) {
      SF_CHECK(ok, "model config: field '", k, "' has the wrong type: expected ", type, ", got ", v.type_name());
    };
    auto integer = [&](int64_t& field) { expect(v.is_number_integer(), "an integer"), field = v.get<int64_t>(); };
    auto number = [&](double& field) { expect(v.is_number(), "a number"), field = v.get<double>(); };
    auto text = [&](std::string& field) { expect(v.is_string(), "a string"), field = v.get<std::string>(); };
    if (k == "preset") continue;
    else if (k == "name") text(c.name);
    else if (k == "vocab_size") integer(c.vocab_size);
    else if (k == "d_model") integer(c.d_model);
    else if (k == "n_layers") integer(c.n_layers);
    else if (k == "n_heads") integer(c.n_heads);
    else if (k == "head_dk") integer(c.head_dk);
    else if (k == "head_dv") integer(c.head_dv);
    else if (k == "conv_size") integer(c.conv_size);
    else if (k == "block_size") integer(c.block_size);
    else if (k == "mlp_hidden") integer(c.mlp_hidden);
    else if (k == "norm_eps") number(c.norm_eps);
    else if (k == "init_std") number(c.init_std);
    else if (k == "seed") expect(v.is_number_unsigned(), "a non-negative integer"), c.seed = v.get<uint64_t>();
    else if (k == "stage_pattern") text(c.stage_pattern);
    else fail("model config: unknown field '", k, "'");
  }
}

ModelConfig ModelConfig::from_json(const nlohmann::json& j) {
  SF_CHECK(j.is_object(), "model config must be a JSON object");
  ModelConfig c;
  if (j.contains("preset")) {
    SF_CHECK(j.at("preset").is_string(), "model config: field 'preset' must be a preset name (a string)");
    c = model_preset(j.at("preset").get<std::string>());
  }
  apply_json(c, j);
  c.validate();
  return c;
}

int64_t ModelConfig::num_parameters() const {
  int64_t hk = n_heads * head_dk, hv = n_heads * head_dv;
  int64_t gdn = d_model * (2 * hk + 2 * hv + 2 * n_heads) + (2 * hk + hv) * conv_size + 2 * n_heads + head_dv +
                hv * d_model;
  int64_t mlp = 3 * d_model * mlp_hidden;
  int64_t block = gdn + mlp + 2 * d_model;
  return vocab_size * d_model + n_layers * block + d_model + d_model * vocab_size;
}

ModelConfig model_preset(const std::string& name) {
  ModelConfig c;
  c.name = name;
  if (name == "tiny") {
    // Small enough for float64 finite differences, big enough to exercise every path.
    c.vocab_size = 48, c.d_model = 24, c.n_layers = 2, c.n_heads = 2, c.head_dk = 8, c.head_dv = 6;
    c.block_size = 8, c.mlp_hidden = 48;
  } else if (name == "small") {
    // The CPU demo: learns associative recall in a few minutes on 2 cores.
    c.vocab_size = 96, c.d_model = 128, c.n_layers = 2, c.n_heads = 4, c.head_dk = 32, c.head_dv = 32;
    c.block_size = 32, c.mlp_hidden = 256;
  } else if (name == "gdn-1.3b") {
    c.vocab_size = 32000, c.d_model = 2048, c.n_layers = 24, c.n_heads = 16, c.head_dk = 128, c.head_dv = 128;
    c.block_size = 64, c.mlp_hidden = 5632;
  } else if (name == "gdn-3b" || name == "gdn-7b" || name == "gdn-14b") {
    // gdn-1.3b scaled up: heads of 128 (q/k and value width = d_model), MLP 2.75 x d_model;
    // layer counts divisible by 4 and 8, so P = 4 and P = 8 pipelines cut them evenly.
    const bool b3 = name == "gdn-3b", b7 = name == "gdn-7b";
    c.vocab_size = 32000, c.d_model = b3 ? 2560 : b7 ? 4096 : 5120, c.n_layers = b3 || b7 ? 32 : 40;
    c.head_dk = c.head_dv = 128, c.n_heads = c.d_model / 128;
    c.block_size = 64, c.mlp_hidden = c.d_model * 11 / 4;
  } else {
    std::string all;
    for (auto& n : model_preset_names()) all += (all.empty() ? "" : ", ") + n;
    fail("unknown model preset '", name, "'; available: ", all);
  }
  return c;
}

std::vector<std::string> model_preset_names() { return {"tiny", "small", "gdn-1.3b", "gdn-3b", "gdn-7b", "gdn-14b"}; }

ModelConfig load_model_config(const std::string& path) {
  std::ifstream f(path);
  SF_CHECK(f.good(), "cannot open model config '", path, "'");
  nlohmann::json j;
  try {
    f >> j;
  } catch (const nlohmann::json::exception& e) {
    fail("model config '", path, "' is not valid JSON: ", e.what());
  }
  return ModelConfig::from_json(j);
}

}  // namespace stateflow
