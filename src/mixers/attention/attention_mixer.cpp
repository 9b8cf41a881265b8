// The softmax attention row of the mixer registry (model/mixer.h): letter A.
#include "mixers/attention/attention_config.h"
#include "mixers/attention/attention_layer.h"
#include "model/mixer.h"

namespace stateflow {

namespace {

// The projections per token, and the core per key a query sees: q.k and p v forward (2 x
// head_dim each, every query head), twice that backward (dV, dP, dQ, dK; the recomputed scores
// are not model FLOPs).
MixerFlops attention_flops(const ModelConfig& cfg) {
  const AttentionConfig a = attention_config(cfg);
  const double matrices = double(a.num_parameters(cfg.d_model) - (a.qk_norm ? 2 * a.head_dim : 0));
  MixerFlops f;
  f.dense_forward = 2 * matrices, f.dense_backward = 4 * matrices;
  f.core_forward_per_key = 4 * double(a.heads * a.head_dim), f.core_backward_per_key = 8 * double(a.heads * a.head_dim);
  return f;
}

// Saved per token: q before and after norm and RoPE, k before its norm, the output, the gate
// and the gated output, and one log-sum-exp per head. The K/V prefix is not stash: it is
// counted in its own category (kv_prefix).
double attention_activation_width(const ModelConfig& cfg) {
  const AttentionConfig a = attention_config(cfg);
  const double q = double(a.heads * a.head_dim), kv = double(a.kv_heads * a.head_dim);
  return (a.qk_norm ? 2 * q + kv : q) + (a.output_gate ? 3 * q : q) + double(a.heads);
}

// The K/V prefix: per sequence, seq_len rows of [kv_heads, head_dim] each (the shape below is
// one row's); chunk c has filled the rows of chunks 0..c.
std::vector<StateTensorSpec> attention_state(const ModelConfig& cfg) {
  const AttentionConfig a = attention_config(cfg);
  return {{"K", {a.kv_heads, a.head_dim}, DType::BF16, true}, {"V", {a.kv_heads, a.head_dim}, DType::BF16, true}};
}

Mixer make_attention_mixer() {
  Mixer m;
  m.letter = 'A';
  m.name = "attention";
  m.description = "causal softmax attention, K/V prefix across chunks";
  m.defaults = {{"heads", 4},         {"kv_heads", 2},     {"head_dim", 8},       {"rotary_dim", 0},
                {"rope_theta", 1e4},  {"qk_norm", true},   {"output_gate", true}, {"norm_eps", 1e-6}};
  m.validate = [](const ModelConfig& cfg) { attention_config(cfg); };
  m.make_layer = [](const std::string& prefix, const ModelConfig& cfg, DType dtype, Rng& rng) -> std::unique_ptr<Layer> {
    return std::make_unique<Attention>(prefix, cfg.d_model, cfg.num_blocks(), attention_config(cfg), dtype, rng);
  };
  m.num_parameters = [](const ModelConfig& cfg) { return attention_config(cfg).num_parameters(cfg.d_model); };
  m.flops_per_token = attention_flops;
  m.activation_width = attention_activation_width;
  m.boundary_state = attention_state;
  m.inner_block = [](const ModelConfig&) { return int64_t(1); };  // the CPU kernel has no token blocks
  return m;
}

}  // namespace

static const MixerRegistration registered(make_attention_mixer());

}  // namespace stateflow
