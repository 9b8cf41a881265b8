#include "train/hf_format.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "core/error.h"
#include "core/file_io.h"
#include "core/safetensors.h"
#include "mixers/gdn/gdn_config.h"
#include "model/device_ops.h"
#include "model/mixer.h"

namespace stateflow {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// How a tensor is laid out on each side. stateflow's dense weights are [in, out] (y = x W),
// torch's nn.Linear weights [out, in]; stateflow's depthwise conv weights are [channels, K],
// torch's nn.Conv1d weights [channels, 1, K]; both put the current token's tap last (K-1).
enum class Layout { Same, Transposed, Conv };

// The tensor table: stateflow parameter name -> fla state-dict name. {i} is the block index
// (stateflow: a GDN block then an MLP block per index; fla: one GatedDeltaNetBlock holding
// attn_norm, attn, mlp_norm, mlp). The gate math agrees as is: both compute
// g = -exp(A_log) * softplus(a_proj x + dt_bias), beta = sigmoid(b_proj x), q and k L2-normed
// (eps 1e-6) and scaled by head_dk^-1/2, conv + SiLU, output RMSNorm(o) * w * silu(g_proj x).
struct TensorRow {
  const char* ours;
  const char* theirs;
  Layout layout;
};
constexpr TensorRow kTensorTable[] = {
    {"embedding.weight", "model.embeddings.weight", Layout::Same},
    {"blocks.{i}.mixer.norm", "model.layers.{i}.attn_norm.weight", Layout::Same},
    {"blocks.{i}.mixer.Wq", "model.layers.{i}.attn.q_proj.weight", Layout::Transposed},
    {"blocks.{i}.mixer.Wk", "model.layers.{i}.attn.k_proj.weight", Layout::Transposed},
    {"blocks.{i}.mixer.Wv", "model.layers.{i}.attn.v_proj.weight", Layout::Transposed},
    {"blocks.{i}.mixer.Wa", "model.layers.{i}.attn.a_proj.weight", Layout::Transposed},
    {"blocks.{i}.mixer.Wb", "model.layers.{i}.attn.b_proj.weight", Layout::Transposed},
    {"blocks.{i}.mixer.Wg", "model.layers.{i}.attn.g_proj.weight", Layout::Transposed},
    {"blocks.{i}.mixer.conv_q", "model.layers.{i}.attn.q_conv1d.weight", Layout::Conv},
    {"blocks.{i}.mixer.conv_k", "model.layers.{i}.attn.k_conv1d.weight", Layout::Conv},
    {"blocks.{i}.mixer.conv_v", "model.layers.{i}.attn.v_conv1d.weight", Layout::Conv},
    {"blocks.{i}.mixer.A_log", "model.layers.{i}.attn.A_log", Layout::Same},
    {"blocks.{i}.mixer.dt_bias", "model.layers.{i}.attn.dt_bias", Layout::Same},
    {"blocks.{i}.mixer.out_norm", "model.layers.{i}.attn.o_norm.weight", Layout::Same},
    {"blocks.{i}.mixer.Wo", "model.layers.{i}.attn.o_proj.weight", Layout::Transposed},
    {"blocks.{i}.mlp.norm", "model.layers.{i}.mlp_norm.weight", Layout::Same},
    {"blocks.{i}.mlp.W1", "model.layers.{i}.mlp.gate_proj.weight", Layout::Transposed},  // silu(x W1) * (x W3)
    {"blocks.{i}.mlp.W3", "model.layers.{i}.mlp.up_proj.weight", Layout::Transposed},
    {"blocks.{i}.mlp.W2", "model.layers.{i}.mlp.down_proj.weight", Layout::Transposed},
    {"final_norm", "model.norm.weight", Layout::Same},
    {"lm_head.weight", "lm_head.weight", Layout::Transposed},
};

std::string with_index(std::string name, int64_t i) {
  const size_t at = name.find("{i}");
  return at == std::string::npos ? name : name.replace(at, 3, std::to_string(i));
}

struct Mapped {
  std::string theirs;
  Layout layout;
};

// Every stateflow parameter name of the model -> its fla name and layout.
std::map<std::string, Mapped> tensor_names(const ModelConfig& c) {
  std::map<std::string, Mapped> out;
  for (const TensorRow& r : kTensorTable) {
    const bool per_block = std::string(r.ours).find("{i}") != std::string::npos;
    for (int64_t i = 0; i < (per_block ? c.num_blocks() : 1); ++i)
      out[with_index(r.ours, i)] = {with_index(r.theirs, i), r.layout};
  }
  return out;
}

Shape their_shape(const Shape& ours, Layout l) {
  if (l == Layout::Transposed) return {ours[1], ours[0]};
  if (l == Layout::Conv) return {ours[0], 1, ours[1]};
  return ours;
}

// fla's intermediate_size when config.json leaves it null (fla's GatedMLP rule).
int64_t fla_default_intermediate(int64_t hidden, double ratio) {
  const int64_t s = static_cast<int64_t>(double(hidden) * ratio * 2 / 3);
  return 256 * ((s + 255) / 256);
}

}  // namespace

// ---------------------------------------------------------------- config.json

json hf_config_of(const ModelConfig& c) {
  c.validate();
  const std::string blocks = c.blocks();
  const size_t other = blocks.find_first_not_of('G');
  SF_CHECK(other == std::string::npos, "block ", other, " of pattern ", c.pattern, " is a ",
           other == std::string::npos ? "" : mixer_for_letter(blocks[other]).name,
           " mixer, but fla's GatedDeltaNetForCausalLM has Gated DeltaNet (G) blocks only");
  const GdnConfig g = gdn_config(c);
  // fla derives the value head size as int(head_dim * expand_v).
  const double expand_v = double(g.head_dv) / double(g.head_dk);
  SF_CHECK(static_cast<int64_t>(double(g.head_dk) * expand_v) == g.head_dv, "fla cannot express gdn.head_dv ",
           g.head_dv, " with gdn.head_dk ", g.head_dk, ": it derives the value head size as int(head_dk * expand_v), ",
           "which gives ", static_cast<int64_t>(double(g.head_dk) * expand_v));
  return {{"architectures", {"GatedDeltaNetForCausalLM"}},
          {"model_type", "gated_deltanet"},
          {"vocab_size", c.vocab_size},
          {"hidden_size", c.d_model},
          {"num_hidden_layers", c.num_blocks()},
          {"num_heads", g.heads},
          {"num_v_heads", g.value_heads},  // fla repeats q, k as '(h g)': value head j reads head j / g, as ours
          {"head_dim", g.head_dk},
          {"expand_v", expand_v},
          {"conv_size", g.conv_size},
          {"intermediate_size", c.mlp_hidden},
          {"hidden_act", "swish"},
          {"norm_eps", c.norm_eps},
          {"use_gate", true},
          {"use_short_conv", true},
          {"allow_neg_eigval", false},
          {"attn", nullptr},
          {"attn_mode", "chunk"},
          {"attnres_block_size", nullptr},
          {"output_gate_activation", "swish"},
          {"tie_word_embeddings", false},
          {"initializer_range", c.init_std},
          {"torch_dtype", "float32"},
          // What fla does not use but a round trip keeps (the kernel's inner block size, the name).
          {"stateflow", {{"name", c.name}, {"block_size", g.block_size}, {"seed", c.seed}}}};
}

ModelConfig model_config_of_hf(const json& j, const std::string& what) {
  SF_CHECK(j.is_object(), what, " is not a JSON object");
  auto refuse_unless = [&](bool ok, const std::string& why) {
    SF_CHECK(ok, what, ": ", why, "; stateflow cannot import it");
  };
  refuse_unless(j.value("model_type", "") == "gated_deltanet",
                cat("model_type is '", j.value("model_type", ""), "', not fla's 'gated_deltanet'"));
  auto integer = [&](const char* key) {
    SF_CHECK(j.contains(key) && j.at(key).is_number_integer(), what, ": field '", key, "' is missing or not an integer");
    return j.at(key).get<int64_t>();
  };
  auto number_or = [&](const char* key, double fallback) {
    if (!j.contains(key) || j.at(key).is_null()) return fallback;
    SF_CHECK(j.at(key).is_number(), what, ": field '", key, "' is not a number");
    return j.at(key).get<double>();
  };
  auto flag_or = [&](const char* key, bool fallback) {
    return j.contains(key) && j.at(key).is_boolean() ? j.at(key).get<bool>() : fallback;
  };
  refuse_unless(!j.contains("attn") || j.at("attn").is_null(),
                "it has softmax-attention layers (field 'attn'), and stateflow has no attention mixer yet");
  const int64_t heads = integer("num_heads");
  const int64_t value_heads = j.contains("num_v_heads") && !j.at("num_v_heads").is_null() ? integer("num_v_heads") : heads;
  refuse_unless(heads >= 1 && value_heads >= heads && value_heads % heads == 0,
                cat("num_v_heads = ", value_heads, " is not a multiple of num_heads = ", heads,
                    " (each q/k head serves num_v_heads / num_heads value heads)"));
  refuse_unless(flag_or("use_gate", true), "use_gate is false, but stateflow's GDN always has the output gate");
  refuse_unless(flag_or("use_short_conv", true),
                "use_short_conv is false, but stateflow's GDN always has the short convolutions");
  refuse_unless(!flag_or("allow_neg_eigval", false), "allow_neg_eigval is true (beta in (0, 2)), not supported");
  refuse_unless(!flag_or("conv_bias", false), "conv_bias is true; stateflow's short convolutions have no bias");
  refuse_unless(!j.contains("attnres_block_size") || j.at("attnres_block_size").is_null(),
                "it has attention residuals (field 'attnres_block_size'), which stateflow's blocks do not have");
  const std::string gate = j.value("output_gate_activation", "swish");
  refuse_unless(gate == "swish" || gate == "silu",
                cat("output_gate_activation is '", gate, "'; stateflow's output gate is silu (swish)"));
  const std::string act = j.value("hidden_act", "swish");
  refuse_unless(act == "swish" || act == "silu", cat("hidden_act is '", act, "'; the MLP is SwiGLU (swish) only"));

  ModelConfig c;
  c.name = j.contains("stateflow") ? j["stateflow"].value("name", "imported") : "imported";
  c.vocab_size = integer("vocab_size");
  c.d_model = integer("hidden_size");
  c.pattern = std::string(static_cast<size_t>(std::clamp<int64_t>(integer("num_hidden_layers"), 0, 4096)), 'G');
  const int64_t head_dk = integer("head_dim");
  c.mixers["gdn"] = {
      {"heads", heads},
      {"value_heads", value_heads == heads ? 0 : value_heads},  // 0: ungrouped, the section's own form
      {"head_dk", head_dk},
      {"head_dv", static_cast<int64_t>(double(head_dk) * number_or("expand_v", 2.0))},  // fla's rule
      {"conv_size", j.contains("conv_size") ? integer("conv_size") : 4},
      // The chunkwise kernel's inner block: not a property of the weights. 64 is the GPU kernels'.
      {"block_size", j.contains("stateflow") ? j["stateflow"].value("block_size", int64_t{64}) : 64}};
  c.mlp_hidden = j.contains("intermediate_size") && !j.at("intermediate_size").is_null()
                     ? integer("intermediate_size")
                     : fla_default_intermediate(c.d_model, number_or("hidden_ratio", 4));
  c.norm_eps = number_or("norm_eps", 1e-6);  // fla's config default
  c.init_std = number_or("initializer_range", 0.02);
  if (j.contains("stateflow")) c.seed = j["stateflow"].value("seed", c.seed);
  c.complete_sections();
  c.validate();
  return c;
}

json read_hf_config(const std::string& dir) {
  const fs::path p = fs::path(dir) / "config.json";
  SF_CHECK(fs::is_regular_file(p), dir, " has no config.json: give a Hugging Face model folder");
  std::ifstream in(p);
  json j = json::parse(in, nullptr, false);
  SF_CHECK(!j.is_discarded(), p.string(), " is not valid JSON");
  return j;
}

// ---------------------------------------------------------------- tensors

void export_hf(Model& model, const std::string& dir) {
  const ModelConfig& c = model.config();
  const json config = hf_config_of(c);
  const std::map<std::string, Mapped> names = tensor_names(c);
  std::vector<Tensor> held;  // f32 tensors in fla's layout, alive until written
  std::vector<StTensorRef> refs;
  for (Param* p : model.params()) {
    auto it = names.find(p->name);
    SF_CHECK(it != names.end(), "parameter ", p->name, " has no place in fla's GatedDeltaNetForCausalLM");
    const Tensor v = p->value.on_host() ? p->value : p->value.to(Device::CPU, MemCategory::Other);
    const Shape shape = their_shape(v.shape(), it->second.layout);
    Tensor out = Tensor::zeros(shape, DType::F32, MemCategory::Other);
    float* dst = out.data<float>();
    dispatch_float(v.dtype(), [&](auto z) {
      const auto* src = v.data<decltype(z)>();
      if (it->second.layout == Layout::Transposed) {
        const int64_t rows = v.dim(0), cols = v.dim(1);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t k = 0; k < cols; ++k) dst[k * rows + r] = static_cast<float>(src[r * cols + k]);
      } else {
        for (int64_t i = 0; i < v.numel(); ++i) dst[i] = static_cast<float>(src[i]);
      }
    });
    held.push_back(out);
    refs.push_back({it->second.theirs, StDtype::F32, shape, held.back().raw()});
  }
  fs::create_directories(dir);
  write_safetensors((fs::path(dir) / "model.safetensors").string(), refs, {{"format", "pt"}});
  write_file_atomically((fs::path(dir) / "config.json").string(), config.dump(2) + "\n");
}

namespace {
// The safetensors files of a Hugging Face folder, each tensor name -> the file holding it.
struct HfTensors {
  std::vector<SafetensorsFile> files;
  std::map<std::string, size_t> where;
};

HfTensors read_hf_tensors(const std::string& dir) {
  const fs::path single = fs::path(dir) / "model.safetensors", index = fs::path(dir) / "model.safetensors.index.json";
  std::vector<std::string> names;
  if (fs::exists(single)) {
    names.push_back(single.string());
  } else if (fs::exists(index)) {
    std::ifstream in(index);
    const json j = json::parse(in, nullptr, false);
    SF_CHECK(!j.is_discarded() && j.contains("weight_map") && j["weight_map"].is_object(), index.string(),
             " is not a safetensors index (a JSON object with a weight_map)");
    std::set<std::string> shards;
    for (auto& [tensor, file] : j["weight_map"].items()) shards.insert(file.get<std::string>());
    for (const std::string& s : shards) names.push_back((fs::path(dir) / s).string());
  } else {
    fail(dir, " has no model.safetensors (nor model.safetensors.index.json); a PyTorch .bin checkpoint must be ",
         "saved again with save_pretrained(..., safe_serialization=True) first");
  }
  HfTensors t;
  for (const std::string& n : names) {
    t.files.push_back(SafetensorsFile::read(n));
    for (const StTensorInfo& info : t.files.back().tensors()) {
      auto [it, fresh] = t.where.emplace(info.name, t.files.size() - 1);
      SF_CHECK(fresh, "tensor ", info.name, " is in two files of ", dir);
    }
  }
  return t;
}

double element(const SafetensorsFile& f, const StTensorInfo& t, int64_t i) {
  const uint8_t* p = f.data(t);
  switch (t.dtype) {
    case StDtype::F32: { float v; std::memcpy(&v, p + 4 * i, 4); return v; }
    case StDtype::F64: { double v; std::memcpy(&v, p + 8 * i, 8); return v; }
    case StDtype::BF16: { BF16 v; std::memcpy(&v, p + 2 * i, 2); return float_from_bf16(v); }
    default: fail(f.what(), ": tensor ", t.name, " is ", st_dtype_name(t.dtype), ", not a float type");
  }
}
}  // namespace

void load_hf_weights(Model& model, const std::string& dir) {
  const ModelConfig& c = model.config();
  const std::map<std::string, Mapped> names = tensor_names(c);
  const bool tied = read_hf_config(dir).value("tie_word_embeddings", false);
  HfTensors hf = read_hf_tensors(dir);
  std::set<std::string> used;
  for (Param* p : model.params()) {
    auto it = names.find(p->name);
    SF_CHECK(it != names.end(), "parameter ", p->name, " has no place in fla's GatedDeltaNetForCausalLM");
    std::string theirs = it->second.theirs;
    Layout layout = it->second.layout;
    if (tied && theirs == "lm_head.weight" && !hf.where.count(theirs))  // tied: the embedding, [vocab, D]
      theirs = "model.embeddings.weight", layout = Layout::Transposed;
    auto at = hf.where.find(theirs);
    SF_CHECK(at != hf.where.end(), dir, " has no tensor ", theirs, " (stateflow's ", p->name, ")");
    const SafetensorsFile& f = hf.files[at->second];
    const StTensorInfo& t = *f.find(theirs);
    const Shape want = their_shape(p->value.shape(), layout);
    SF_CHECK(t.shape == want, dir, ": tensor ", theirs, " has shape ", shape_str(t.shape), " but the model (",
             p->name, ") needs ", shape_str(want), ": config.json and the weights disagree");
    Tensor host = Tensor::zeros(p->value.shape(), p->value.dtype(), MemCategory::Other);
    dispatch_float(host.dtype(), [&](auto z) {
      using T = decltype(z);
      T* dst = host.data<T>();
      if (layout == Layout::Transposed) {
        const int64_t rows = host.dim(0), cols = host.dim(1);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t k = 0; k < cols; ++k) dst[r * cols + k] = static_cast<T>(element(f, t, k * rows + r));
      } else {
        for (int64_t i = 0; i < host.numel(); ++i) dst[i] = static_cast<T>(element(f, t, i));
      }
    });
    p->value.copy_from(host);
    if (p->value_bf16.defined()) refresh_bf16_copy(*p);
    used.insert(theirs);
  }
  for (const auto& [name, file] : hf.where)
    SF_CHECK(used.count(name), dir, " holds tensor ", name, ", which has no place in stateflow's model; ",
             "stateflow cannot import it");
}

}  // namespace stateflow
