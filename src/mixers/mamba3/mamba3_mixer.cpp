// The Mamba-3 row of the mixer registry (model/mixer.h): letter M.
#include "core/error.h"
#include "mixers/mamba3/mamba3_config.h"
#include "mixers/mamba3/mamba3_layer.h"
#include "model/mixer.h"

namespace stateflow {

Mamba3Config mamba3_config(const ModelConfig& cfg) {
  Mamba3Config m;
  m.heads = section_int(cfg, "mamba3", "heads", 1, 1024);
  m.head_dim = section_int(cfg, "mamba3", "head_dim", 1, 1024);
  m.state_size = section_int(cfg, "mamba3", "state_size", 1, 1024);
  m.rank = section_int(cfg, "mamba3", "rank", 1, 64);
  m.groups = section_int(cfg, "mamba3", "groups", 1, m.heads);
  m.rope_fraction = section_number(cfg, "mamba3", "rope_fraction", 0, 1);
  m.block_size = section_int(cfg, "mamba3", "block_size", 1, 1024);
  m.output_norm = section_flag(cfg, "mamba3", "output_norm");
  m.dt_min = section_number(cfg, "mamba3", "dt_min", 1e-6, 10);
  m.dt_max = section_number(cfg, "mamba3", "dt_max", 1e-6, 10);
  SF_CHECK(m.heads % m.groups == 0, "model config: mamba3.groups = ", m.groups, " must divide mamba3.heads = ",
           m.heads, " (each group's B and C serve heads/groups heads)");
  SF_CHECK(m.angles() >= 1, "model config: mamba3.rope_fraction = ", m.rope_fraction, " with mamba3.state_size = ",
           m.state_size, " turns no coordinate pair; raise either so that state_size * rope_fraction >= 2");
  SF_CHECK(m.dt_min <= m.dt_max, "model config: mamba3.dt_min = ", m.dt_min, " is above mamba3.dt_max = ", m.dt_max,
           "; the initial step sizes are drawn from [dt_min, dt_max]");
  return m;
}

namespace {

int64_t mamba3_parameters(const ModelConfig& cfg) {
  const Mamba3Config m = mamba3_config(cfg);
  const int64_t D = cfg.d_model, HP = m.heads * m.head_dim, BC = m.rank * m.groups * m.state_size;
  // Wz Wx WB WC Wdt WA Wtrap Wang; dt_bias, the B and C norms, their biases, D; mimo_x/z/o;
  // the output norm; Wo.
  const int64_t mimo = m.rank > 1 ? 3 * m.heads * m.rank * m.head_dim : 0;
  return D * (2 * HP + 2 * BC + 3 * m.heads + m.angles()) + m.heads + 2 * m.state_size +
         2 * m.heads * m.rank * m.state_size + m.heads + mimo + (m.output_norm ? m.head_dim : 0) + HP * D;
}

// MATH.md section 9: the core per head and token with blocks of C tokens, rank R.
MixerFlops mamba3_flops(const ModelConfig& cfg) {
  const Mamba3Config m = mamba3_config(cfg);
  const double D = double(cfg.d_model), H = double(m.heads), P = double(m.head_dim), N = double(m.state_size);
  const double R = double(m.rank), G = double(m.groups), C = double(m.block_size), NA = double(m.angles());
  const double matrices = D * (2 * H * P + 2 * R * G * N + 3 * H + NA) + H * P * D;
  MixerFlops f;
  f.dense_forward = 2 * matrices, f.dense_backward = 4 * matrices;
  f.core_forward = H * (4 * R * N * P + 2 * C * R * R * (N + P));
  f.core_backward = H * (10 * R * N * P + 2 * C * R * R * (3 * N + 2 * P));
  return f;
}

// The stash per token: projections, rank-R inputs and rotated B/C, core output (and its
// normalised copy), gated output.
double mamba3_activation_width(const ModelConfig& cfg) {
  const Mamba3Config m = mamba3_config(cfg);
  const double HP = double(m.heads * m.head_dim), HRP = double(m.heads * m.rank * m.head_dim);
  const double HRN = double(m.heads * m.rank * m.state_size), RGN = double(m.rank * m.groups * m.state_size);
  const double norm = m.output_norm ? HRP + double(m.heads * m.rank) : 0;
  return 3 * HP + 2 * HRP + 2 * HRN + 2 * RGN + double(m.heads) * (6 + double(m.angles())) + norm;
}

std::vector<StateTensorSpec> mamba3_state(const ModelConfig& cfg) {
  const Mamba3Config m = mamba3_config(cfg);
  return {{"S", {m.heads, m.head_dim, m.state_size}, DType::F32, false},
          {"phi", {m.heads, m.angles()}, DType::F32, false},
          {"b_prev", {m.heads, m.rank, m.state_size}, DType::F32, false},
          {"x_prev", {m.heads, m.rank, m.head_dim}, DType::F32, false}};
}

Mixer make_mamba3_mixer() {
  Mixer m;
  m.letter = 'M';
  m.name = "mamba3";
  m.description = "Mamba-3";
  m.defaults = {{"heads", 2},   {"head_dim", 6},         {"state_size", 8}, {"rank", 1},
                {"groups", 1},  {"rope_fraction", 0.5}, {"block_size", 8}, {"output_norm", false},
                {"dt_min", 1e-3}, {"dt_max", 1e-1}};
  m.validate = [](const ModelConfig& cfg) { mamba3_config(cfg); };
  m.make_layer = [](const std::string& prefix, const ModelConfig& cfg, DType dtype, Rng& rng) -> std::unique_ptr<Layer> {
    return std::make_unique<Mamba3Mixer>(prefix, cfg, dtype, rng);
  };
  m.num_parameters = mamba3_parameters;
  m.flops_per_token = mamba3_flops;
  m.activation_width = mamba3_activation_width;
  m.boundary_state = mamba3_state;
  m.inner_block = [](const ModelConfig& cfg) { return mamba3_config(cfg).block_size; };
  return m;
}

}  // namespace

static const MixerRegistration registered(make_mamba3_mixer());

}  // namespace stateflow
