// The scalar-decay linear-attention row of the mixer registry (model/mixer.h): letter S.
#include "mixers/sdecay/sdecay_layer.h"
#include "model/mixer.h"

namespace stateflow {

SdecayConfig sdecay_config(const ModelConfig& cfg) {
  return {section_int(cfg, "sdecay", "heads", 1, 1024), section_int(cfg, "sdecay", "head_dk", 1, 1024),
          section_int(cfg, "sdecay", "head_dv", 1, 1024)};
}

namespace {

Mixer make_sdecay_mixer() {
  Mixer m;
  m.letter = 'S';
  m.name = "sdecay";
  m.description = "scalar-decay linear attention, CPU only";
  m.defaults = {{"heads", 2}, {"head_dk", 8}, {"head_dv", 8}};
  m.validate = [](const ModelConfig& cfg) { sdecay_config(cfg); };
  m.make_layer = [](const std::string& prefix, const ModelConfig& cfg, DType dtype, Rng& rng) -> std::unique_ptr<Layer> {
    return std::make_unique<ScalarDecayAttention>(prefix, cfg, dtype, rng);
  };
  m.num_parameters = [](const ModelConfig& cfg) {  // Wq Wk Wv Wa, A_log and dt_bias, Wo
    const SdecayConfig s = sdecay_config(cfg);
    return cfg.d_model * (2 * s.heads * s.head_dk + 2 * s.heads * s.head_dv + s.heads) + 2 * s.heads;
  };
  m.flops_per_token = [](const ModelConfig& cfg) {
    const SdecayConfig s = sdecay_config(cfg);
    const double D = double(cfg.d_model), H = double(s.heads), dk = double(s.head_dk), dv = double(s.head_dv);
    const double matrices = D * (2 * H * dk + 2 * H * dv + H);
    // Per head and token: the state update and its read (2 dk dv each); backward recomputes the
    // update and has five dk x dv products (dS, dq, dk, dv, dg).
    return MixerFlops{2 * matrices, 4 * matrices, H * 4 * dk * dv, H * 12 * dk * dv};
  };
  m.activation_width = [](const ModelConfig& cfg) {  // q, k, v, o and the two gate columns
    const SdecayConfig s = sdecay_config(cfg);
    return double(2 * s.heads * s.head_dk + 2 * s.heads * s.head_dv + 2 * s.heads);
  };
  m.boundary_state = [](const ModelConfig& cfg) {
    const SdecayConfig s = sdecay_config(cfg);
    return std::vector<StateTensorSpec>{{"S", {s.heads, s.head_dv, s.head_dk}, DType::F32, false}};
  };
  m.inner_block = [](const ModelConfig&) { return int64_t(1); };
  return m;
}

}  // namespace

static const MixerRegistration registered(make_sdecay_mixer());

}  // namespace stateflow
