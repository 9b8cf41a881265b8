// The full GDN layer: StateFlow split == unsplit (outputs, final state, dx, initial-state
// gradient, parameter gradients) and hand-written backward == finite differences (float64).
// Grouped values: a layer with value_heads = 2 x heads equals an ungrouped layer whose q/k
// heads are repeated for their value heads, and its q/k gradients are that layer's summed over
// each group.
#include <gtest/gtest.h>

#include "layer_testing.h"
#include "mixers/gdn/gdn_groups.h"
#include "mixers/gdn/gdn_layer.h"
#include "model/mixer.h"
#include "model/model.h"
#include "test_util.h"

using namespace stateflow;
using namespace stateflow::testing;

namespace {

ModelConfig layer_config() {
  ModelConfig c = model_preset("tiny");
  c.d_model = 10;
  c.mixers["gdn"] = {{"heads", 2}, {"head_dk", 4}, {"head_dv", 3}, {"conv_size", 4}, {"block_size", 8}};
  c.complete_sections();
  return c;
}

struct Fixture {
  ModelConfig cfg = layer_config();
  uint64_t seed = fresh_seed();
  Rng rng{seed};
  GatedDeltaNet layer{"gdn", cfg, DType::F64, rng};
  int64_t B = 2, T = 40;
  Tensor x = random_tensor(rng, {B * T, cfg.d_model});
  Tensor dy = random_tensor(rng, {B * T, cfg.d_model});
  State state0, dstate_final;
  Fixture() {
    // Shapes of the boundary state come from the layer itself.
    ChunkCtx ctx;
    ctx.len = 1, ctx.batch = B;
    State out;
    std::unique_ptr<Stash> stash;
    layer.forward(ctx, take_rows(x, B, T, 0, 1), {}, out, stash);
    state0 = random_state_like(rng, out);
    dstate_final = random_state_like(rng, out);
  }
};

void expect_split_matches(Fixture& f, const std::vector<int64_t>& pieces, double tol) {
  SCOPED_TRACE("seed " + std::to_string(f.seed));
  SplitRun u = run_split(f.layer, f.x, f.B, f.T, f.state0, f.dy, f.dstate_final, {f.T});
  SplitRun s = run_split(f.layer, f.x, f.B, f.T, f.state0, f.dy, f.dstate_final, pieces);
  EXPECT_LE(max_rel_diff(s.y, u.y), tol) << "output";
  EXPECT_LE(max_rel_diff(s.dx, u.dx), tol) << "dx";
  ASSERT_EQ(s.final_state.size(), size_t(GatedDeltaNet::kStateSize));
  for (size_t i = 0; i < s.final_state.size(); ++i) {
    EXPECT_LE(max_rel_diff(s.final_state[i], u.final_state[i]), tol) << "final state " << i;
    EXPECT_LE(max_rel_diff(s.dstate_initial[i], u.dstate_initial[i]), tol) << "initial-state gradient " << i;
  }
  auto params = f.layer.params();
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_LE(max_rel_diff(s.param_grads[i], u.param_grads[i]), tol) << params[i]->name;
}

}  // namespace

TEST(GdnLayer, SplitEqualsUnsplit) {
  Fixture f;
  for (auto pieces : std::vector<std::vector<int64_t>>{
           {16, 24}, {11, 2, 1, 19, 7}, {8, 8, 8, 8, 8}, {20, 20}, {14, 13, 13}, {10, 10, 10, 10}, {5, 5, 5, 5, 5, 5, 5, 5}})
    expect_split_matches(f, pieces, 1e-12);
}

TEST(GdnLayer, SplitDownToOneTokenChunks) {
  Fixture f;
  expect_split_matches(f, std::vector<int64_t>(f.T, 1), 1e-12);
  expect_split_matches(f, {1, 2, 3, 1, 33}, 1e-12);
}

TEST(GdnLayer, BackwardMatchesFiniteDifferences) {
  Fixture f;
  SCOPED_TRACE("seed " + std::to_string(f.seed));
  SplitRun u = run_split(f.layer, f.x, f.B, f.T, f.state0, f.dy, f.dstate_final, {f.T});
  auto loss = [&]() {
    SplitRun r = run_split(f.layer, f.x, f.B, f.T, f.state0, f.dy, f.dstate_final, {f.T});
    double l = dot(r.y, f.dy);
    for (size_t i = 0; i < r.final_state.size(); ++i) l += dot(r.final_state[i], f.dstate_final[i]);
    return l;
  };
  std::vector<Tensor> inputs{f.x}, grads{u.dx};
  for (size_t i = 0; i < f.state0.size(); ++i) inputs.push_back(f.state0[i]), grads.push_back(u.dstate_initial[i]);
  EXPECT_LE(fd_check_tensors(loss, inputs, grads, f.rng, 3), 1e-6) << "input and initial state";
  auto params = f.layer.params();
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_LE(fd_check_tensors(loss, {params[i]->value}, {u.param_grads[i]}, f.rng, 2), 1e-6)
        << params[i]->name << " seed " << f.seed;
}

TEST(GdnLayer, FiniteDifferencesFlagAWrongGradient) {
  Fixture f;
  SplitRun u = run_split(f.layer, f.x, f.B, f.T, f.state0, f.dy, f.dstate_final, {f.T});
  auto loss = [&]() {
    SplitRun r = run_split(f.layer, f.x, f.B, f.T, f.state0, f.dy, f.dstate_final, {f.T});
    return dot(r.y, f.dy);
  };
  Tensor wrong = u.dx.clone();
  for (int64_t i = 0; i < wrong.numel(); ++i) wrong.data<double>()[i] *= 1.001;
  EXPECT_GT(fd_check_tensors(loss, {f.x}, {wrong}, f.rng, 2), 1e-5);
}

TEST(GdnGroups, ValueHeadJReadsQueryKeyHeadJOverGroupAndGradientsSumInOrder) {
  // 1 row, 2 q/k heads of 2 values, groups of 3: value heads 0-2 read head 0, 3-5 head 1.
  const std::vector<double> x = {1, 2, 3, 4};
  std::vector<double> y(12), dx(4);
  gdn_expand_groups<double>(x.data(), y.data(), 1, 2, 3, 2);
  EXPECT_EQ(y, (std::vector<double>{1, 2, 1, 2, 1, 2, 3, 4, 3, 4, 3, 4}));
  const std::vector<double> dy = {1, 10, 100, 1000, 1e4, 1e5, 2, 20, 200, 2000, 2e4, 2e5};
  gdn_sum_groups<double>(dy.data(), dx.data(), 1, 2, 3, 2);
  EXPECT_EQ(dx, (std::vector<double>{10101, 101010, 20202, 202020}));
}

namespace {

ModelConfig grouped_config(int64_t heads, int64_t value_heads) {
  ModelConfig c = layer_config();
  c.mixers["gdn"]["heads"] = heads, c.mixers["gdn"]["value_heads"] = value_heads;
  c.validate();
  return c;
}

// A q/k-width tensor of the grouped layer read as [rows, heads, d], repeated per value head: [rows, ...].
Tensor repeat_heads(const Tensor& t, int64_t rows, int64_t heads, int64_t group, int64_t d) {
  Tensor out = Tensor::zeros({rows, t.numel() * group / rows}, DType::F64);
  gdn_expand_groups<double>(t.data<double>(), out.data<double>(), rows, heads, group, d);
  return out;
}
// The plain layer's gradient of such a tensor summed over each group: flat.
Tensor sum_heads(const Tensor& t, int64_t rows, int64_t heads, int64_t group, int64_t d) {
  Tensor out = Tensor::zeros({t.numel() / group}, DType::F64);
  gdn_sum_groups<double>(t.data<double>(), out.data<double>(), rows, heads, group, d);
  return out;
}
Tensor flat(const Tensor& t) { return t.reshape({t.numel()}); }

}  // namespace

TEST(GdnLayer, GroupedValuesEqualAnUngroupedLayerWithRepeatedQueryKeyHeads) {
  const int64_t H = 2, G = 2, HV = H * G, B = 2, T = 29;
  const ModelConfig gc = grouped_config(H, HV), uc = grouped_config(HV, 0);
  const GdnConfig g = gdn_config(gc);
  const int64_t dk = g.head_dk, Km1 = g.conv_size - 1;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  GatedDeltaNet grouped("gdn", gc, DType::F64, rng), plain("gdn", uc, DType::F64, rng);
  // The plain layer's weights: the grouped layer's, with Wq, Wk (columns) and conv_q, conv_k
  // (rows of K taps) repeated per value head.
  auto gp = grouped.params(), up = plain.params();
  ASSERT_EQ(gp.size(), up.size());
  for (size_t i = 0; i < gp.size(); ++i) {
    const std::string name = gp[i]->name.substr(4);  // "gdn.Wq" -> "Wq"
    Tensor v = gp[i]->value;
    if (name == "Wq" || name == "Wk") v = repeat_heads(v, gc.d_model, H, G, dk);
    if (name == "conv_q" || name == "conv_k") v = repeat_heads(v, 1, H, G, dk * g.conv_size);
    ASSERT_EQ(v.numel(), up[i]->value.numel()) << name;
    std::copy_n(v.data<double>(), v.numel(), up[i]->value.data<double>());
  }
  const Tensor x = random_tensor(rng, {B * T, gc.d_model}), dy = random_tensor(rng, {B * T, gc.d_model});
  // Boundary states: S [B, HV, dv, dk] alike; the q/k conv prefixes repeated. The final q/k
  // prefix gradient goes to the first value head of each group (the plain layer's prefix copies
  // are equal, so only their sum over the group matters).
  State s0 = {random_tensor(rng, {B, HV, g.head_dv, dk}), random_tensor(rng, {B, Km1, H * dk}),
              random_tensor(rng, {B, Km1, H * dk}), random_tensor(rng, {B, Km1, HV * g.head_dv})};
  State d1 = {random_tensor(rng, {B, HV, g.head_dv, dk}), random_tensor(rng, {B, Km1, H * dk}),
              random_tensor(rng, {B, Km1, H * dk}), random_tensor(rng, {B, Km1, HV * g.head_dv})};
  State s0u = s0, d1u = d1;
  for (int i : {GatedDeltaNet::kPrefixQ, GatedDeltaNet::kPrefixK}) {
    s0u[i] = repeat_heads(s0[i], B * Km1, H, G, dk).reshape({B, Km1, HV * dk});
    d1u[i] = Tensor::zeros({B, Km1, HV * dk}, DType::F64);
    for (int64_t r = 0; r < B * Km1; ++r)
      for (int64_t h = 0; h < H; ++h)
        std::copy_n(d1[i].data<double>() + (r * H + h) * dk, dk, d1u[i].data<double>() + (r * HV + h * G) * dk);
  }
  for (const std::vector<int64_t>& pieces : {std::vector<int64_t>{T}, {5, 11, 13}}) {
    SplitRun a = run_split(grouped, x, B, T, s0, dy, d1, pieces), b = run_split(plain, x, B, T, s0u, dy, d1u, pieces);
    EXPECT_LE(max_rel_diff(a.y, b.y), 1e-12) << "output";
    EXPECT_LE(max_rel_diff(a.dx, b.dx), 1e-12) << "dx";
    for (int i = 0; i < GatedDeltaNet::kStateSize; ++i) {
      const bool qk = i == GatedDeltaNet::kPrefixQ || i == GatedDeltaNet::kPrefixK;
      const int64_t rows = B * Km1;
      EXPECT_LE(max_rel_diff(qk ? flat(repeat_heads(a.final_state[i], rows, H, G, dk)) : a.final_state[i],
                             qk ? flat(b.final_state[i]) : b.final_state[i]),
                1e-12)
          << "final state " << i;
      EXPECT_LE(max_rel_diff(qk ? flat(a.dstate_initial[i]) : a.dstate_initial[i],
                             qk ? sum_heads(b.dstate_initial[i], rows, H, G, dk) : b.dstate_initial[i]),
                1e-12)
          << "initial-state gradient " << i;
    }
    for (size_t i = 0; i < gp.size(); ++i) {
      const std::string name = gp[i]->name.substr(4);
      Tensor want = b.param_grads[i];
      if (name == "Wq" || name == "Wk") want = sum_heads(want, gc.d_model, H, G, dk);
      if (name == "conv_q" || name == "conv_k") want = sum_heads(want, 1, H, G, dk * g.conv_size);
      EXPECT_LE(max_rel_diff(flat(a.param_grads[i]), flat(want)), 1e-12) << name;
    }
  }
}

TEST(GdnLayer, GroupedValuesChunkedEqualsUnchunkedAndMatchFiniteDifferences) {
  const ModelConfig c = grouped_config(2, 6);
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  GatedDeltaNet layer("gdn", c, DType::F64, rng);
  const int64_t B = 2, T = 21;
  const Tensor x = random_tensor(rng, {B * T, c.d_model}), dy = random_tensor(rng, {B * T, c.d_model});
  SplitRun u = run_split(layer, x, B, T, {}, dy, {}, {T});
  SplitRun s = run_split(layer, x, B, T, {}, dy, {}, {1, 9, 11});
  EXPECT_LE(max_rel_diff(s.y, u.y), 1e-12);
  auto params = layer.params();
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_LE(max_rel_diff(s.param_grads[i], u.param_grads[i]), 1e-12) << params[i]->name;
  auto loss = [&]() { return dot(run_split(layer, x, B, T, {}, dy, {}, {T}).y, dy); };
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_LE(fd_check_tensors(loss, {params[i]->value}, {u.param_grads[i]}, rng, 2), 1e-6) << params[i]->name;
}

TEST(GdnConfig, ValueHeadsMustBeAMultipleOfTheHeads) {
  EXPECT_EQ(gdn_config(grouped_config(2, 0)).value_heads, 2);  // 0: ungrouped
  EXPECT_EQ(gdn_config(grouped_config(2, 6)).group(), 3);
  expect_error([] { grouped_config(4, 6); }, "gdn.value_heads = 6 must be a multiple of gdn.heads = 4");
  expect_error([] { grouped_config(4, 2); }, "gdn.value_heads = 2 must be a multiple of gdn.heads = 4");
  expect_error([] { grouped_config(2, -1); }, "gdn.value_heads = -1 is out of range");
}

TEST(GdnConfig, TheGpuNamesTheCoresHeadSizes) {
  const Mixer& gdn = mixer_for_letter('G');
  ModelConfig c = grouped_config(2, 4);
  EXPECT_NO_THROW(gdn.check_device(c, Device::CPU));  // any size on the CPU
  expect_error([&] { gdn.check_device(c, Device::CUDA); },
               "the CUDA core runs gdn.head_dk = gdn.head_dv = 128 and gdn.block_size = 64 only (got head_dk = 4");
  c.mixers["gdn"]["head_dk"] = 256, c.mixers["gdn"]["head_dv"] = 256, c.mixers["gdn"]["block_size"] = 64;
  expect_error([&] { gdn.check_device(c, Device::CUDA); }, "heads of 256 have no GPU kernel");
  c.mixers["gdn"]["head_dk"] = 128, c.mixers["gdn"]["head_dv"] = 128;
  EXPECT_NO_THROW(gdn.check_device(c, Device::CUDA));  // grouped values run on the GPU
  c.mixers["gdn"]["value_heads"] = 258;
  expect_error([&] { gdn.check_device(c, Device::CUDA); }, "gdn.value_heads = 258 is above the gate kernel's 256");
  c.mixers["gdn"]["value_heads"] = 4;
  // The model checks before it draws a weight (a CPU build has no CUDA backend to reach).
  c.mixers["gdn"]["head_dk"] = 256;
  expect_error([&] { Model m(c, DType::F32, 0, Model::num_layers_of(c), Device::CUDA); }, "heads of 256");
}

TEST(GdnConfig, ParameterCountMatchesTheLayer) {
  for (const ModelConfig& c : {grouped_config(2, 0), grouped_config(2, 6)}) {
    Rng rng(1);
    GatedDeltaNet layer("gdn", c, DType::F64, rng);
    int64_t n = 0;
    for (Param* p : layer.params()) n += p->value.numel();
    EXPECT_EQ(n, mixer_for_letter('G').num_parameters(c));
  }
}
