// The Gated DeltaNet row of the mixer registry (model/mixer.h): letter G.
#include "core/error.h"
#include "mixers/gdn/gdn_config.h"
#include "mixers/gdn/gdn_layer.h"
#include "model/mixer.h"

namespace stateflow {

GdnConfig gdn_config(const ModelConfig& cfg) {
  const int64_t heads = section_int(cfg, "gdn", "heads", 1, 1024);
  int64_t value_heads = section_int(cfg, "gdn", "value_heads", 0, 1024);
  if (value_heads == 0) value_heads = heads;
  SF_CHECK(value_heads % heads == 0, "model config: gdn.value_heads = ", value_heads,
           " must be a multiple of gdn.heads = ", heads,
           " (each query/key head serves value_heads / heads value heads, as Qwen3-Next's 16 and 32); ",
           "0 means as many as gdn.heads");
  return {heads,
          value_heads,
          section_int(cfg, "gdn", "head_dk", 1, 1024),
          section_int(cfg, "gdn", "head_dv", 1, 1024),
          section_int(cfg, "gdn", "conv_size", 1, 64),
          section_int(cfg, "gdn", "block_size", 1, 1024),
          section_flag(cfg, "gdn", "keep_sweep")};
}

namespace {

int64_t gdn_parameters(const ModelConfig& cfg) {
  const GdnConfig g = gdn_config(cfg);
  const int64_t D = cfg.d_model, HK = g.heads * g.head_dk, HV = g.value_heads * g.head_dv;
  // Wq Wk Wv Wg Wa Wb, the three convs, A_log and dt_bias, the output norm, Wo.
  return D * (2 * HK + 2 * HV + 2 * g.value_heads) + (2 * HK + HV) * g.conv_size + 2 * g.value_heads + g.head_dv +
         HV * D;
}

// The chunk core per value head and token, with blocks of C tokens, as MATH.md section 9 counts
// it (backward recomputes W, U and the state transition). Grouped values run the core per value
// head on its q/k head's copy, so the core counts value heads.
MixerFlops gdn_flops(const ModelConfig& cfg) {
  const GdnConfig g = gdn_config(cfg);
  const double D = double(cfg.d_model), H = double(g.heads), HV = double(g.value_heads);
  const double dk = double(g.head_dk), dv = double(g.head_dv), C = double(g.block_size);
  // Weight matrices: q, k, v, the output gate, beta and g projections, and the output projection.
  const double matrices = D * (2 * H * dk + 2 * HV * dv + 2 * HV) + HV * dv * D;
  MixerFlops f;
  f.dense_forward = 2 * matrices, f.dense_backward = 4 * matrices;
  f.core_forward = HV * (6 * dk * dv + 2 * C * (3 * dk + 2 * dv) + 2 * C * C / 3);
  f.core_backward = HV * (18 * dk * dv + 18 * C * dk + 10 * C * dv + 4 * C * C);
  return f;
}

// q~, k~, v~ and their convolved, normalised forms dominate; the depth predictions scale by it.
// A kept sweep adds G, W, V_new and the entering states (2 + dk + dv + dv dk / C bf16-sized values
// per token and value head).
double gdn_activation_width(const ModelConfig& cfg) {
  const GdnConfig g = gdn_config(cfg);
  const double dk = double(g.head_dk), dv = double(g.head_dv), C = double(g.block_size);
  const double sweep = g.keep_sweep ? double(g.value_heads) * (2 + dk + dv + dv * dk / C) : 0.0;
  return double(2 * g.heads * g.head_dk + 2 * g.value_heads * g.head_dv + 2 * g.value_heads) + sweep;
}

std::vector<StateTensorSpec> gdn_state(const ModelConfig& cfg) {
  const GdnConfig g = gdn_config(cfg);
  const int64_t HK = g.heads * g.head_dk, HV = g.value_heads * g.head_dv;
  return {{"S", {g.value_heads, g.head_dv, g.head_dk}, DType::F32, false},
          {"conv_prefix_q", {g.conv_size - 1, HK}, DType::BF16, false},
          {"conv_prefix_k", {g.conv_size - 1, HK}, DType::BF16, false},
          {"conv_prefix_v", {g.conv_size - 1, HV}, DType::BF16, false}};
}

// The CUDA core's one shape (mixers/gdn/gdn_core_cuda.h, "Supported"): heads of 128 both ways and
// sub-chunks of 64. Head dim 256 would need another core; grouped values need none (the layer
// gives each value head its q/k head's copy).
void gdn_check_device(const ModelConfig& cfg, Device device) {
  if (device != Device::CUDA) return;
  const GdnConfig g = gdn_config(cfg);
  SF_CHECK(g.head_dk == 128 && g.head_dv == 128 && g.block_size == 64,
           "gdn on the GPU: the CUDA core runs gdn.head_dk = gdn.head_dv = 128 and gdn.block_size = 64 only (got ",
           "head_dk = ", g.head_dk, ", head_dv = ", g.head_dv, ", block_size = ", g.block_size,
           "); heads of 256 have no GPU kernel yet. Set those sizes, or run on the CPU (docs/guide.md, "
           "\"Gated DeltaNet heads\")");
  SF_CHECK(g.value_heads <= 256, "gdn on the GPU: gdn.value_heads = ", g.value_heads,
           " is above the gate kernel's 256 heads; use at most 256 value heads, or run on the CPU");
}

Mixer make_gdn_mixer() {
  Mixer m;
  m.letter = 'G';
  m.name = "gdn";
  m.description = "Gated DeltaNet";
  m.defaults = {{"heads", 2},     {"value_heads", 0}, {"head_dk", 8},        {"head_dv", 8},
                {"conv_size", 4}, {"block_size", 8},  {"keep_sweep", false}};
  m.settings = {"keep_sweep"};
  m.validate = [](const ModelConfig& cfg) { gdn_config(cfg); };
  m.make_layer = [](const std::string& prefix, const ModelConfig& cfg, DType dtype, Rng& rng) -> std::unique_ptr<Layer> {
    return std::make_unique<GatedDeltaNet>(prefix, cfg, dtype, rng);
  };
  m.num_parameters = gdn_parameters;
  m.flops_per_token = gdn_flops;
  m.activation_width = gdn_activation_width;
  m.boundary_state = gdn_state;
  m.inner_block = [](const ModelConfig& cfg) { return gdn_config(cfg).block_size; };
  m.check_device = gdn_check_device;
  return m;
}

}  // namespace

static const MixerRegistration registered(make_gdn_mixer());

}  // namespace stateflow
