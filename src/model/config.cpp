#include "model/config.h"

#include <fstream>

#include "core/error.h"
#include "model/mixer.h"

namespace stateflow {

std::string ModelConfig::blocks() const {
  std::string out;
  for (char c : pattern)
    if (c != '|') out += c;
  return out;
}

const nlohmann::json& ModelConfig::section(const std::string& mixer) const {
  static const nlohmann::json none = nlohmann::json::object();
  auto it = mixers.find(mixer);
  return it == mixers.end() ? none : *it;
}

void ModelConfig::complete_sections() {
  nlohmann::json out = nlohmann::json::object();
  for (char letter : blocks()) {
    const Mixer& m = mixer_for_letter(letter);
    if (out.contains(m.name)) continue;
    nlohmann::json s = m.defaults;
    for (auto& [k, v] : section(m.name).items()) s[k] = v;
    out[m.name] = std::move(s);
  }
  mixers = std::move(out);
}

static void validate_pattern(const std::string& pattern) {
  SF_CHECK(!pattern.empty(), "model config: pattern is empty; give one letter per block, e.g. \"GG\" (",
           mixer_letters_help(), ")");
  SF_CHECK(pattern.front() != '|' && pattern.back() != '|' && pattern.find("||") == std::string::npos,
           "model config: pattern '", pattern, "' has an empty stage; every stage between '|' needs a block");
  for (char c : pattern)
    if (c != '|') mixer_for_letter(c);  // throws naming the known letters
}

void ModelConfig::validate() const {
  auto positive = [](const char* field, int64_t v, int64_t max) {
    SF_CHECK(v >= 1 && v <= max, "model config: ", field, " = ", v, " is out of range; accepted: 1..", max);
  };
  positive("vocab_size", vocab_size, int64_t(1) << 30);
  positive("d_model", d_model, 1 << 16);
  positive("mlp_hidden", mlp_hidden, 1 << 20);
  SF_CHECK(norm_eps > 0 && norm_eps < 1, "model config: norm_eps = ", norm_eps, " must be in (0, 1)");
  SF_CHECK(init_std > 0 && init_std < 10, "model config: init_std = ", init_std, " must be in (0, 10)");
  validate_pattern(pattern);
  SF_CHECK(num_blocks() <= 1024, "model config: pattern has ", num_blocks(), " blocks; at most 1024");
  for (char letter : blocks()) {
    const Mixer& m = mixer_for_letter(letter);
    SF_CHECK(section(m.name).is_object(), "model config: section '", m.name, "' must be a JSON object");
    for (auto& [k, v] : section(m.name).items())
      SF_CHECK(m.defaults.contains(k), "model config: ", m.name, ".", k, " is not a field of ", m.name, "; fields: ",
               [&] {
                 std::string f;
                 for (auto& [dk, dv] : m.defaults.items()) f += (f.empty() ? "" : ", ") + dk;
                 return f;
               }());
    m.validate(*this);
  }
}

nlohmann::json ModelConfig::to_json() const {
  nlohmann::json j = {{"name", name},           {"vocab_size", vocab_size}, {"d_model", d_model},
                      {"mlp_hidden", mlp_hidden}, {"norm_eps", norm_eps},   {"init_std", init_std},
                      {"seed", seed},           {"pattern", pattern}};
  for (auto& [k, v] : mixers.items()) j[k] = v;
  return j;
}

// Fields that earlier versions had at the top level: an error that says where they went.
static void refuse_old_field(const std::string& k) {
  if (k == "n_layers" || k == "stage_pattern")
    fail("model config: field '", k, "' was replaced by 'pattern' (one letter per block, '|' between stages, e.g. ",
         "\"GG|GG\"; ", mixer_letters_help(), ")");
  if (k == "n_heads" || k == "head_dk" || k == "head_dv" || k == "conv_size" || k == "block_size")
    fail("model config: field '", k, "' moved into the Gated DeltaNet section: {\"gdn\": {\"",
         k == "n_heads" ? "heads" : k, "\": ...}}");
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
    else if (k == "mlp_hidden") integer(c.mlp_hidden);
    else if (k == "norm_eps") number(c.norm_eps);
    else if (k == "init_std") number(c.init_std);
    else if (k == "seed") expect(v.is_number_unsigned(), "a non-negative integer"), c.seed = v.get<uint64_t>();
    else if (k == "pattern") text(c.pattern);
    else if (find_mixer(k)) {
      expect(v.is_object(), "an object (the mixer's section)");
      for (auto& [f, fv] : v.items()) c.mixers[k][f] = fv;  // over the preset's section, field by field
    } else {
      refuse_old_field(k);
      fail("model config: unknown field '", k, "'");
    }
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
  validate_pattern(c.pattern);
  for (auto& [k, v] : c.mixers.items())
    SF_CHECK(c.blocks().find(find_mixer(k)->letter) != std::string::npos || j.contains("preset"),
             "model config: section '", k, "' is given but the pattern '", c.pattern, "' has no ", find_mixer(k)->letter,
             " block");
  c.complete_sections();
  c.validate();
  return c;
}

int64_t ModelConfig::num_parameters() const {
  int64_t blocks_total = 0;
  for (char letter : blocks())
    blocks_total += mixer_for_letter(letter).num_parameters(*this) + 3 * d_model * mlp_hidden + 2 * d_model;
  return vocab_size * d_model + blocks_total + d_model + d_model * vocab_size;
}

static ModelConfig gdn_preset(const std::string& name, int64_t vocab, int64_t d, int64_t blocks, int64_t heads,
                              int64_t dk, int64_t dv, int64_t block_size, int64_t mlp) {
  ModelConfig c;
  c.name = name, c.vocab_size = vocab, c.d_model = d, c.mlp_hidden = mlp;
  c.pattern = std::string(blocks, 'G');
  c.mixers["gdn"] = {{"heads", heads}, {"head_dk", dk}, {"head_dv", dv}, {"block_size", block_size}};
  c.complete_sections();
  return c;
}

// A GDN preset with every fourth block attention ("GGGA" repeated), in the manner of
// Qwen3-Next: heads of 256, two K/V heads, RoPE on a quarter of each head, base 1e7.
static ModelConfig hybrid_preset(const std::string& name, const std::string& base, int64_t attention_heads) {
  ModelConfig c = model_preset(base);
  c.name = name;
  std::string pattern;
  for (int64_t b = 0; b < c.num_blocks(); b += 4) pattern += "GGGA";
  c.pattern = pattern;
  c.mixers["attention"] = {{"heads", attention_heads}, {"kv_heads", 2},        {"head_dim", 256},
                           {"rotary_dim", 64},         {"rope_theta", 1e7}};
  c.complete_sections();
  return c;
}

// A preset's Mamba-3 blocks: the pattern and the mamba3 section (GDN's stays if the pattern uses G).
static ModelConfig with_mamba3(ModelConfig c, const std::string& pattern, const nlohmann::json& section) {
  c.pattern = pattern;
  c.mixers["mamba3"] = section;
  c.complete_sections();
  return c;
}

ModelConfig model_preset(const std::string& name) {
  // Small enough for float64 finite differences, big enough to exercise every path.
  if (name == "tiny") return gdn_preset(name, 48, 24, 2, 2, 8, 6, 8, 48);
  // The CPU demo: learns associative recall in a few minutes on 2 cores.
  if (name == "small") return gdn_preset(name, 96, 128, 2, 4, 32, 32, 32, 256);
  // The demo with grouped values laid out as Qwen3.5's GDN: q/k width d_model, two value heads per
  // q/k head (value width 2 x d_model).
  if (name == "small-grouped") {
    ModelConfig c = gdn_preset(name, 96, 128, 2, 4, 32, 32, 32, 256);
    c.mixers["gdn"]["value_heads"] = 8;
    return c;
  }
  if (name == "gdn-1.3b") return gdn_preset(name, 32000, 2048, 24, 16, 128, 128, 64, 5632);
  // gdn-1.3b scaled up: heads of 128 (q/k and value width = d_model), MLP 2.75 x d_model;
  // block counts divisible by 4 and 8, so P = 4 and P = 8 pipelines cut them evenly.
  if (name == "gdn-3b") return gdn_preset(name, 32000, 2560, 32, 20, 128, 128, 64, 2560 * 11 / 4);
  if (name == "gdn-7b") return gdn_preset(name, 32000, 4096, 32, 32, 128, 128, 64, 4096 * 11 / 4);
  if (name == "gdn-14b") return gdn_preset(name, 32000, 5120, 40, 40, 128, 128, 64, 5120 * 11 / 4);
  // Mamba-3 (docs/mamba3.md): the CPU demo's shape, and a ~1.3B model of 32 heads of P = 64,
  // state N = 128 and one B/C group; the mix alternates GDN and Mamba-3 blocks of the 1.3B sizes.
  const nlohmann::json mamba3_1_3b = {{"heads", 32}, {"head_dim", 64}, {"state_size", 128}, {"block_size", 64}};
  if (name == "mamba3-small")
    return with_mamba3(gdn_preset(name, 96, 128, 2, 4, 32, 32, 32, 256), "MM",
                       {{"heads", 4}, {"head_dim", 32}, {"state_size", 32}, {"block_size", 32}, {"output_norm", true}});
  if (name == "mamba3-1.3b")
    return with_mamba3(gdn_preset(name, 32000, 2048, 24, 16, 128, 128, 64, 5632), std::string(24, 'M'), mamba3_1_3b);
  if (name == "gdn-mamba3-1.3b") {
    std::string pattern;
    for (int i = 0; i < 12; ++i) pattern += "GM";
    return with_mamba3(gdn_preset(name, 32000, 2048, 24, 16, 128, 128, 64, 5632), pattern, mamba3_1_3b);
  }
  // The GDN presets with one attention block in four (query width = d_model).
  if (name == "hybrid-1.3b") return hybrid_preset(name, "gdn-1.3b", 8);
  if (name == "hybrid-3b") return hybrid_preset(name, "gdn-3b", 10);
  if (name == "hybrid-7b") return hybrid_preset(name, "gdn-7b", 16);
  std::string all;
  for (auto& n : model_preset_names()) all += (all.empty() ? "" : ", ") + n;
  fail("unknown model preset '", name, "'; available: ", all);
}

std::vector<std::string> model_preset_names() {
  return {"tiny",        "small",       "small-grouped", "gdn-1.3b",        "gdn-3b",      "gdn-7b",   "gdn-14b",
          "mamba3-small", "mamba3-1.3b", "gdn-mamba3-1.3b", "hybrid-1.3b", "hybrid-3b", "hybrid-7b"};
}

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

ModelConfig resolve_model_config(const std::string& preset, const std::string& config_path,
                                 const std::string& pattern) {
  ModelConfig c = config_path.empty() ? model_preset(preset) : load_model_config(config_path);
  if (!pattern.empty()) {
    c.pattern = pattern;
    validate_pattern(c.pattern);
    c.complete_sections();
    c.validate();
  }
  return c;
}

}  // namespace stateflow
