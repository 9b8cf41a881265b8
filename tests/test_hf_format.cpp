// Hugging Face export/import (train/hf_format.h): a model exported and imported again has
// bitwise its weights and config; the tensors are in fla's names and layouts (torch Linear
// [out, in], Conv1d [ch, 1, K]); bf16 and tied-embedding checkpoints import; what cannot map
// is refused with the reason. The fla round trip itself runs on a GPU machine
// (tools/fla_roundtrip.py, docs/guide.md).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/safetensors.h"
#include "temp_dir.h"
#include "test_util.h"
#include "mixers/gdn/gdn_config.h"
#include "train/hf_format.h"

using namespace stateflow;
using namespace stateflow::testing;
using nlohmann::json;

namespace {

ModelConfig random_config(Rng& rng) {
  ModelConfig c = model_preset("tiny");
  c.seed = rng.next_u64();
  c.pattern = std::string(1 + rng.below(3), 'G');
  c.mixers["gdn"]["conv_size"] = 2 + static_cast<int64_t>(rng.below(3));
  if (rng.below(2)) c.mixers["gdn"]["value_heads"] = 2 * c.mixers["gdn"]["heads"].get<int64_t>();  // grouped
  c.complete_sections();
  return c;
}

void write_json(const std::string& path, const json& j) { std::ofstream(path) << j.dump(2); }

}  // namespace

TEST(HfFormat, ExportThenImportGivesBackEveryWeightBitwise) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  Rng rng(seed);
  const ModelConfig c = random_config(rng);
  Model a(c, DType::F32);
  TempDir tmp;
  export_hf(a, tmp / "hf");
  const ModelConfig back = model_config_of_hf(read_hf_config(tmp / "hf"), "config.json");
  EXPECT_EQ(back.to_json(), c.to_json());
  ModelConfig other = c;
  other.seed = c.seed + 1;  // other random weights, all to be overwritten
  Model b(other, DType::F32);
  load_hf_weights(b, tmp / "hf");
  for (Param* p : a.params()) {
    const Param* q = b.find_param(p->name);
    ASSERT_NE(q, nullptr) << p->name;
    EXPECT_EQ(0, std::memcmp(p->value.raw(), q->value.raw(), p->value.nbytes())) << p->name;
  }
}

TEST(HfFormat, TensorsHaveFlasNamesAndLayouts) {
  Rng rng(fresh_seed());
  const ModelConfig c = random_config(rng);
  Model m(c, DType::F64);
  TempDir tmp;
  export_hf(m, tmp / "hf");
  const SafetensorsFile f = SafetensorsFile::read(tmp / "hf/model.safetensors");
  EXPECT_EQ(f.meta("format"), "pt");
  EXPECT_EQ(f.tensors().size(), m.params().size());
  auto value = [&](const std::string& name, int64_t i) {
    const StTensorInfo* t = f.find(name);
    EXPECT_NE(t, nullptr) << name;
    EXPECT_EQ(t->dtype, StDtype::F32);
    float v;
    std::memcpy(&v, f.data(*t) + 4 * i, 4);
    return v;
  };
  const GdnConfig g = gdn_config(c);
  const int64_t last = c.num_blocks() - 1, HK = g.heads * g.head_dk, D = c.d_model;
  // nn.Linear weight [out, in]: q_proj.weight[o][i] = Wq[i][o].
  const Param* Wq = m.find_param("blocks." + std::to_string(last) + ".mixer.Wq");
  const std::string q = "model.layers." + std::to_string(last) + ".attn.q_proj.weight";
  EXPECT_EQ(f.find(q)->shape, (Shape{HK, D}));
  for (int64_t o : {int64_t(0), HK - 1})
    for (int64_t i : {int64_t(0), D - 1}) EXPECT_EQ(value(q, o * D + i), float(Wq->value.data<double>()[i * HK + o]));
  // Conv1d weight [channels, 1, K], the current token's tap last as in stateflow.
  const Param* conv = m.find_param("blocks.0.mixer.conv_v");
  const StTensorInfo* cv = f.find("model.layers.0.attn.v_conv1d.weight");
  EXPECT_EQ(cv->shape, (Shape{g.value_heads * g.head_dv, 1, g.conv_size}));
  EXPECT_EQ(value(cv->name, g.conv_size - 1), float(conv->value.data<double>()[g.conv_size - 1]));
  EXPECT_EQ(f.find("lm_head.weight")->shape, (Shape{c.vocab_size, D}));
  EXPECT_EQ(f.find("model.layers.0.attn.A_log")->shape, (Shape{g.value_heads}));
  EXPECT_EQ(f.find("model.layers.0.attn.b_proj.weight")->shape, (Shape{g.value_heads, D}));
  EXPECT_EQ(f.find("model.layers.0.attn.o_norm.weight")->shape, (Shape{g.head_dv}));
  const json j = read_hf_config(tmp / "hf");
  EXPECT_EQ(j["model_type"], "gated_deltanet");
  EXPECT_EQ(j["architectures"][0], "GatedDeltaNetForCausalLM");
  EXPECT_EQ(j["hidden_size"], D);
  EXPECT_EQ(j["head_dim"], g.head_dk);
  EXPECT_EQ(j["num_heads"], g.heads);
  EXPECT_EQ(j["num_v_heads"], g.value_heads);
  EXPECT_EQ(double(g.head_dk) * j["expand_v"].get<double>(), double(g.head_dv));
  EXPECT_EQ(j["intermediate_size"], c.mlp_hidden);
}

TEST(HfFormat, ImportsBf16AndTiedEmbeddingsAndFlasDefaults) {
  Rng rng(fresh_seed());
  const ModelConfig c = random_config(rng);
  Model m(c, DType::F32);
  TempDir tmp;
  export_hf(m, tmp / "hf");
  // Rewrite every tensor as bf16, drop lm_head.weight and tie it to the embedding.
  const SafetensorsFile f = SafetensorsFile::read(tmp / "hf/model.safetensors");
  std::vector<std::vector<BF16>> data;
  std::vector<StTensorRef> refs;
  for (const StTensorInfo& t : f.tensors()) {
    if (t.name == "lm_head.weight") continue;
    std::vector<BF16> v((t.end - t.begin) / 4);
    for (size_t i = 0; i < v.size(); ++i) {
      float x;
      std::memcpy(&x, f.data(t) + 4 * i, 4);
      v[i] = bf16_from_float(x);
    }
    data.push_back(std::move(v));
    refs.push_back({t.name, StDtype::BF16, t.shape, data.back().data()});
  }
  write_safetensors(tmp / "hf/model.safetensors", refs, {{"format", "pt"}});
  json j = read_hf_config(tmp / "hf");
  j["tie_word_embeddings"] = true;
  j.erase("stateflow");  // fla's own configs have no block size: the GPU kernels' 64
  write_json(tmp / "hf/config.json", j);
  EXPECT_EQ(gdn_config(model_config_of_hf(j, "x")).block_size, 64);
  Model b(c, DType::F32);
  load_hf_weights(b, tmp / "hf");
  const Tensor& emb = b.find_param("embedding.weight")->value;
  const Tensor& head = b.find_param("lm_head.weight")->value;  // [D, vocab] = embedding^T
  EXPECT_EQ(head.data<float>()[1 * c.vocab_size + 2], emb.data<float>()[2 * c.d_model + 1]);
  const float w = m.find_param("blocks.0.mlp.W2")->value.data<float>()[3];
  EXPECT_EQ(b.find_param("blocks.0.mlp.W2")->value.data<float>()[3], float_from_bf16(bf16_from_float(w)));

  json d = j;  // intermediate_size null: fla's rule, 256 * ceil(int(hidden * ratio * 2 / 3) / 256)
  d["intermediate_size"] = nullptr, d["hidden_ratio"] = 4, d["hidden_size"] = 1000;
  EXPECT_EQ(model_config_of_hf(d, "x").mlp_hidden, 2816);
}

TEST(HfFormat, RefusesWhatCannotMapAndSaysWhy) {
  Rng rng(fresh_seed());
  const ModelConfig c = random_config(rng);
  const json good = hf_config_of(c);
  auto refused = [&](const char* key, json value, const std::string& needle) {
    json j = good;
    j[key] = value;
    expect_error([&] { model_config_of_hf(j, "cfg"); }, needle);
  };
  refused("model_type", "mamba2", "not fla's 'gated_deltanet'");
  refused("attn", {{"layers", {1}}, {"num_heads", 4}}, "no attention mixer yet");
  refused("num_v_heads", 2 * gdn_config(c).heads + 1, "is not a multiple of num_heads");
  refused("use_gate", false, "output gate");
  refused("use_short_conv", false, "short convolutions");
  refused("allow_neg_eigval", true, "allow_neg_eigval");
  refused("hidden_act", "gelu", "SwiGLU");
  refused("output_gate_activation", "sigmoid", "output gate is silu");
  refused("attnres_block_size", 4, "attention residuals");
  refused("num_heads", "four", "'num_heads' is missing or not an integer");
  ModelConfig odd = c;
  odd.mixers["gdn"]["head_dk"] = 11, odd.mixers["gdn"]["head_dv"] = 15;  // int(11 * (15 / 11.0)) = 14
  expect_error([&] { hf_config_of(odd); }, "fla cannot express gdn.head_dv 15");
  ModelConfig hybrid = c;
  hybrid.pattern = "GA";  // fla's GatedDeltaNetForCausalLM has no room for other mixers' blocks
  hybrid.complete_sections();
  expect_error([&] { hf_config_of(hybrid); }, "block 1 of pattern GA is a attention mixer");


  Model m(c, DType::F32);
  TempDir tmp;
  expect_error([&] { load_hf_weights(m, tmp.path.string()); }, "no config.json");
  export_hf(m, tmp / "hf");
  ModelConfig wider = c;
  wider.d_model += 8;
  Model w(wider, DType::F32);
  expect_error([&] { load_hf_weights(w, tmp / "hf"); }, "config.json and the weights disagree");
  // An extra tensor (say a hybrid model's attention) is refused, not dropped.
  const SafetensorsFile f = SafetensorsFile::read(tmp / "hf/model.safetensors");
  std::vector<StTensorRef> refs;
  for (const StTensorInfo& t : f.tensors()) refs.push_back({t.name, t.dtype, t.shape, f.data(t)});
  const float extra[2] = {1, 2};
  refs.push_back({"model.layers.0.attn.q_norm.weight", StDtype::F32, {2}, extra});
  write_safetensors(tmp / "hf/model.safetensors", refs, {{"format", "pt"}});
  expect_error([&] { load_hf_weights(m, tmp / "hf"); }, "q_norm.weight, which has no place in stateflow's model");
  const std::string missing = refs.front().name;  // and a missing one is named
  refs.erase(refs.begin());
  refs.pop_back();
  write_safetensors(tmp / "hf/model.safetensors", refs, {{"format", "pt"}});
  expect_error([&] { load_hf_weights(m, tmp / "hf"); }, "has no tensor " + missing);
  std::filesystem::remove(tmp / "hf/model.safetensors");
  expect_error([&] { load_hf_weights(m, tmp / "hf"); }, "safe_serialization=True");
}
