// The full GDN layer: StateFlow split == unsplit (outputs, final state, dx, initial-state
// gradient, parameter gradients) and hand-written backward == finite differences (float64).
#include <gtest/gtest.h>

#include "layer_testing.h"
#include "mixers/gdn/gdn_layer.h"
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
