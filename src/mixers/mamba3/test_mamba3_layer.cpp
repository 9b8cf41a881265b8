// The Mamba-3 layer: StateFlow split == unsplit (outputs, the four-tensor final state, dx,
// initial-state gradients, parameter gradients; chunks down to one token, lengths that don't
// divide the block), hand-written backward == finite differences (float64), SISO and MIMO,
// and config validation naming the field.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "layer_testing.h"
#include "mixers/mamba3/mamba3_layer.h"
#include "model/optimizer.h"
#include "model/mixer.h"
#include "test_util.h"

using namespace stateflow;
using namespace stateflow::testing;

namespace {

// A two-block Mamba-3 model of width 10 with this mamba3 section (over the defaults).
ModelConfig model_with(const nlohmann::json& section) {
  ModelConfig c = model_preset("tiny");
  c.d_model = 10, c.pattern = "MM", c.mixers = {{"mamba3", section}};
  c.complete_sections();
  c.validate();
  return c;
}

ModelConfig siso_config() {
  return model_with({{"heads", 2}, {"head_dim", 3}, {"state_size", 6}, {"rank", 1}, {"block_size", 4}});
}

ModelConfig mimo_config() {
  return model_with({{"heads", 4}, {"head_dim", 3}, {"state_size", 4}, {"rank", 2}, {"groups", 2},
                     {"rope_fraction", 1.0}, {"block_size", 5}, {"output_norm", true}});
}

struct Fixture {
  uint64_t seed = fresh_seed();
  Rng rng{seed};
  Mamba3Mixer layer;
  int64_t B = 2, T = 23, d_model = 10;
  Tensor x, dy;
  State state0, dstate_final;
  explicit Fixture(const ModelConfig& cfg) : layer("mamba3", cfg, DType::F64, rng) {
    // Random weights everywhere (the init sets several to constants), at the init's scale.
    for (Param* p : layer.params()) p->value = random_tensor(rng, p->value.shape(), DType::F64, 0.5);
    x = random_tensor(rng, {B * T, d_model});
    dy = random_tensor(rng, {B * T, d_model});
    ChunkCtx ctx;
    ctx.len = 1, ctx.batch = B;
    State out;
    std::unique_ptr<Stash> stash;
    layer.forward(ctx, take_rows(x, B, T, 0, 1), {}, out, stash);
    state0 = random_state_like(rng, out, 0.5);
    dstate_final = random_state_like(rng, out, 0.5);
  }
};

void expect_split_matches(Fixture& f, const std::vector<int64_t>& pieces, double tol) {
  SCOPED_TRACE("seed " + std::to_string(f.seed) + ", " + std::to_string(pieces.size()) + " pieces");
  SplitRun u = run_split(f.layer, f.x, f.B, f.T, f.state0, f.dy, f.dstate_final, {f.T});
  SplitRun s = run_split(f.layer, f.x, f.B, f.T, f.state0, f.dy, f.dstate_final, pieces);
  EXPECT_LE(max_rel_diff(s.y, u.y), tol) << "output";
  EXPECT_LE(max_rel_diff(s.dx, u.dx), tol) << "dx";
  ASSERT_EQ(s.final_state.size(), size_t(Mamba3Mixer::kStateSize));
  for (size_t i = 0; i < s.final_state.size(); ++i) {
    EXPECT_LE(max_rel_diff(s.final_state[i], u.final_state[i]), tol) << "final state " << i;
    EXPECT_LE(max_rel_diff(s.dstate_initial[i], u.dstate_initial[i]), tol) << "initial-state gradient " << i;
  }
  auto params = f.layer.params();
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_LE(max_rel_diff(s.param_grads[i], u.param_grads[i]), tol) << params[i]->name;
}

void expect_backward_matches_fd(Fixture& f) {
  SCOPED_TRACE("seed " + std::to_string(f.seed));
  SplitRun u = run_split(f.layer, f.x, f.B, f.T, f.state0, f.dy, f.dstate_final, {f.T});
  auto loss = [&]() {
    SplitRun r = run_split(f.layer, f.x, f.B, f.T, f.state0, f.dy, f.dstate_final, {f.T});
    double l = dot(r.y, f.dy);
    for (size_t i = 0; i < r.final_state.size(); ++i) l += dot(r.final_state[i], f.dstate_final[i]);
    return l;
  };
  EXPECT_LE(fd_check_tensors(loss, {f.x}, {u.dx}, f.rng, 2), 1e-6) << "dx";
  const char* names[] = {"S", "phi", "b_prev", "x_prev"};
  for (size_t i = 0; i < f.state0.size(); ++i)
    EXPECT_LE(fd_check_tensors(loss, {f.state0[i]}, {u.dstate_initial[i]}, f.rng, 2), 1e-6)
        << "initial " << names[i];
  auto params = f.layer.params();
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_LE(fd_check_tensors(loss, {params[i]->value}, {u.param_grads[i]}, f.rng, 2), 1e-6) << params[i]->name;
}

const std::vector<std::vector<int64_t>> kPieces = {
    {12, 11}, {1, 1, 1, 20}, {2, 2, 2, 17}, {5, 1, 3, 9, 5}, {4, 4, 4, 4, 4, 3}, std::vector<int64_t>(23, 1)};

}  // namespace

TEST(Mamba3Layer, SisoSplitEqualsUnsplit) {
  Fixture f(siso_config());
  for (auto& pieces : kPieces) expect_split_matches(f, pieces, 1e-12);
}

TEST(Mamba3Layer, MimoSplitEqualsUnsplit) {
  Fixture f(mimo_config());
  for (auto& pieces : kPieces) expect_split_matches(f, pieces, 1e-12);
}

TEST(Mamba3Layer, SisoBackwardMatchesFiniteDifferences) {
  Fixture f(siso_config());
  expect_backward_matches_fd(f);
}

TEST(Mamba3Layer, MimoBackwardMatchesFiniteDifferences) {
  Fixture f(mimo_config());
  expect_backward_matches_fd(f);
}

TEST(Mamba3Layer, FiniteDifferencesFlagAWrongGradient) {
  Fixture f(siso_config());
  SplitRun u = run_split(f.layer, f.x, f.B, f.T, f.state0, f.dy, f.dstate_final, {f.T});
  auto loss = [&]() { return dot(run_split(f.layer, f.x, f.B, f.T, f.state0, f.dy, f.dstate_final, {f.T}).y, f.dy); };
  Tensor wrong = u.dx.clone();
  for (int64_t i = 0; i < wrong.numel(); ++i) wrong.data<double>()[i] *= 1.001;
  EXPECT_GT(fd_check_tensors(loss, {f.x}, {wrong}, f.rng, 2), 1e-5);
}

// The emitted angle is reduced to [-pi, pi] at every token, whatever the chunking, so long
// sequences keep it small.
TEST(Mamba3Layer, EmittedAngleIsReduced) {
  Fixture f(siso_config());
  for (int64_t i = 0; i < f.state0[Mamba3Mixer::kPhi].numel(); ++i) f.state0[Mamba3Mixer::kPhi].data<double>()[i] = 40;
  SplitRun u = run_split(f.layer, f.x, f.B, f.T, f.state0, f.dy, f.dstate_final, {f.T});
  const Tensor& phi = u.final_state[Mamba3Mixer::kPhi];
  for (int64_t i = 0; i < phi.numel(); ++i) EXPECT_LE(std::abs(phi.data<double>()[i]), M_PI + 1e-12);
}

TEST(Mamba3Layer, Float32TracksFloat64) {
  Fixture f(mimo_config());
  SplitRun ref = run_split(f.layer, f.x, f.B, f.T, f.state0, f.dy, f.dstate_final, {f.T});
  Rng rng(f.seed);
  Mamba3Mixer layer32("mamba3", mimo_config(), DType::F32, rng);
  auto p64 = f.layer.params(), p32 = layer32.params();
  for (size_t i = 0; i < p64.size(); ++i) p32[i]->value = p64[i]->value.cast(DType::F32);
  State s0, ds;
  for (auto& t : f.state0) s0.push_back(t.cast(DType::F32));
  for (auto& t : f.dstate_final) ds.push_back(t.cast(DType::F32));
  SplitRun r = run_split(layer32, f.x.cast(DType::F32), f.B, f.T, s0, f.dy.cast(DType::F32), ds, {7, 1, 15});
  EXPECT_LE(max_rel_diff(r.y.cast(DType::F64), ref.y), 1e-4);
  EXPECT_LE(max_rel_diff(r.dx.cast(DType::F64), ref.dx), 1e-4);
  for (size_t i = 0; i < p64.size(); ++i)
    EXPECT_LE(max_rel_diff(r.param_grads[i].cast(DType::F64), ref.param_grads[i]), 1e-3) << p64[i]->name;
}

TEST(Mamba3Config, ValidationNamesTheField) {
  auto bad = [](const nlohmann::json& section, const std::string& needle) {
    expect_error([&] { model_with(section); }, needle);
  };
  bad({{"heads", 0}}, "mamba3.heads = 0 is out of range");
  bad({{"head_dim", 0}}, "mamba3.head_dim");
  bad({{"state_size", -1}}, "mamba3.state_size");
  bad({{"rank", 0}}, "mamba3.rank");
  bad({{"block_size", 0}}, "mamba3.block_size");
  bad({{"heads", 4}, {"groups", 3}}, "mamba3.groups = 3 must divide mamba3.heads = 4");
  bad({{"rope_fraction", 1.5}}, "mamba3.rope_fraction");
  bad({{"state_size", 2}, {"rope_fraction", 0.5}}, "turns no coordinate pair");
  bad({{"head_size", 4}}, "mamba3.head_size is not a field of mamba3");
  bad({{"heads", 2.5}}, "mamba3.heads' has the wrong type");
  bad({{"dt_min", 0.0}}, "mamba3.dt_min = 0 is out of range");
  bad({{"dt_min", 0.5}, {"dt_max", 0.1}}, "mamba3.dt_min = 0.5 is above mamba3.dt_max = 0.1");
  model_with(nlohmann::json::object());  // the defaults are valid
}

TEST(Mamba3Config, ParameterCountMatchesTheLayer) {
  for (const ModelConfig& c : {siso_config(), mimo_config()}) {
    Rng rng(1);
    Mamba3Mixer layer("m", c, DType::F64, rng);
    int64_t n = 0;
    for (Param* p : layer.params()) n += p->value.numel();
    EXPECT_EQ(n, mixer_for_letter('M').num_parameters(c));
  }
}

// The initial weights are the reference's (state-spaces/mamba, modules/mamba3.py): step sizes
// dt = softplus(dt_bias) log-uniform in [1e-3, 1e-1] per head; B/C norm weights, B/C biases,
// D and the output norm at 1; MIMO's x and output weights at 1/R (means over ranks), its gate
// weights at 1; input projections N(0, 1/d_model); the output projection
// N(0, 1/(H P) / (2 blocks)) (small residual branches, as the other blocks).
TEST(Mamba3Layer, InitialisationFollowsTheReference) {
  ModelConfig c = model_with({{"heads", 64}, {"head_dim", 3}, {"state_size", 4}, {"rank", 2}, {"groups", 2},
                              {"rope_fraction", 1.0}, {"block_size", 5}, {"output_norm", true}});
  c.d_model = 256;
  Rng rng(fresh_seed());
  Mamba3Mixer layer("m", c, DType::F64, rng);
  auto values = [&](const std::string& name) {
    for (Param* p : layer.params())
      if (p->name == "m." + name) return std::vector<double>(p->value.data<double>(), p->value.data<double>() + p->value.numel());
    ADD_FAILURE() << "no parameter m." << name;
    return std::vector<double>{};
  };
  auto all_equal = [&](const std::string& name, double v) {
    for (double x : values(name)) ASSERT_EQ(x, v) << name;
  };
  for (const char* name : {"B_norm", "C_norm", "B_bias", "C_bias", "D", "out_norm", "mimo_z"}) all_equal(name, 1.0);
  all_equal("mimo_x", 0.5), all_equal("mimo_o", 0.5);
  // Weight decay as in the reference: the projections and MIMO tables yes, the B/C bias tables
  // (matrix-shaped, but biases) and the vectors no.
  for (Param* p : layer.params()) {
    const bool bias = p->name == "m.B_bias" || p->name == "m.C_bias" || p->value.ndim() < 2;
    EXPECT_EQ(takes_weight_decay(*p), !bias) << p->name;
  }

  // dt: inside [1e-3, 1e-1], spread over it (64 heads: each decade's half holds some)
  int low = 0, high = 0;
  for (double b : values("dt_bias")) {
    const double dt = std::log1p(std::exp(b));
    EXPECT_GE(dt, 1e-3 * (1 - 1e-12));
    EXPECT_LE(dt, 1e-1 * (1 + 1e-12));
    low += dt < 1e-2, high += dt >= 1e-2;
  }
  EXPECT_GE(low, 16);
  EXPECT_GE(high, 16);

  // A chosen range (dt_min, dt_max) is the one drawn from, spread over it the same way.
  ModelConfig wide = c;
  wide.mixers["mamba3"]["dt_min"] = 0.01, wide.mixers["mamba3"]["dt_max"] = 1.0;
  Mamba3Mixer wide_layer("w", wide, DType::F64, rng);
  int wide_low = 0, wide_high = 0;
  for (Param* p : wide_layer.params()) {
    if (p->name != "w.dt_bias") continue;
    for (int64_t h = 0; h < p->value.numel(); ++h) {
      const double dt = std::log1p(std::exp(p->value.data<double>()[h]));
      EXPECT_GE(dt, 1e-2 * (1 - 1e-12));
      EXPECT_LE(dt, 1.0 * (1 + 1e-12));
      wide_low += dt < 0.1, wide_high += dt >= 0.1;
    }
  }
  EXPECT_GE(wide_low, 16);
  EXPECT_GE(wide_high, 16);

  auto std_of = [&](const std::string& name) {
    double s = 0;
    const std::vector<double> v = values(name);
    for (double x : v) s += x * x;
    return std::sqrt(s / double(v.size()));
  };
  for (const char* name : {"Wz", "Wx", "WB", "WC"}) EXPECT_NEAR(std_of(name), 1.0 / 16, 0.1 / 16) << name;
  EXPECT_NEAR(std_of("Wo"), 1.0 / std::sqrt(64.0 * 3) / 2, 0.1 / std::sqrt(64.0 * 3) / 2);  // 2 blocks
}
