// The Mamba-3 layer against numbers from the design notes' float64 numpy oracle
// (testdata/mamba3_reference.json, written by testdata/make_reference_fixture.py): one chunk
// from a random four-tensor state, forward and backward, SISO and MIMO R = 2. This pins the
// conventions the self-consistency tests cannot see: the rotary pairing (2j, 2j+1), the
// projection layout, rank handling and where each bias and gate sits.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <numbers>
#include <nlohmann/json.hpp>

#include "mixers/mamba3/mamba3_layer.h"
#include "test_util.h"

using namespace stateflow;

namespace {

nlohmann::json load_fixture() {
  std::ifstream f(std::string(STATEFLOW_SOURCE_DIR) + "/src/mixers/mamba3/testdata/mamba3_reference.json");
  EXPECT_TRUE(f.good()) << "missing testdata/mamba3_reference.json";
  return nlohmann::json::parse(f);
}

Tensor tensor_of(const nlohmann::json& values, const Shape& shape) {
  Tensor t = Tensor::zeros(shape, DType::F64);
  EXPECT_EQ(int64_t(values.size()), t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = values[i].get<double>();
  return t;
}

// Columns [c0, c0 + n) of a row-major [rows, cols] matrix given as a flat list.
Tensor columns_of(const nlohmann::json& values, int64_t rows, int64_t cols, int64_t c0, int64_t n) {
  Tensor t = Tensor::zeros({rows, n}, DType::F64);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < n; ++c) t.data<double>()[r * n + c] = values[r * cols + c0 + c].get<double>();
  return t;
}

// The oracle's angles are not reduced mod 2 pi; ours are, at every token.
double angle_diff(const Tensor& ours, const Tensor& ref) {
  double worst = 0;
  for (int64_t i = 0; i < ours.numel(); ++i)
    worst = std::max(worst, std::abs(std::remainder(ours.data<double>()[i] - ref.data<double>()[i],
                                                    2 * std::numbers::pi)));
  return worst;
}

void check_case(const nlohmann::json& c) {
  const auto& dm = c["dims"];
  const int64_t Dm = dm["Dm"], H = dm["H"], P = dm["P"], N = dm["N"], R = dm["R"], NA = dm["NA"], T = dm["T"];
  ModelConfig cfg = model_preset("tiny");
  cfg.d_model = Dm, cfg.pattern = "M";
  cfg.mixers = {{"mamba3", {{"heads", H}, {"head_dim", P}, {"state_size", N}, {"rank", R}, {"groups", 1},
                            {"rope_fraction", 2.0 * double(NA) / double(N)}, {"block_size", dm["block"]}}}};
  cfg.complete_sections();
  cfg.validate();
  ASSERT_EQ(mamba3_config(cfg).angles(), NA);
  Rng rng(1);
  Mamba3Mixer layer("m", cfg, DType::F64, rng);

  // The oracle's one input projection W_in = [z | x | B | C | dd_dt | dd_A | trap | ang].
  const auto& p = c["params"];
  const std::vector<int64_t> widths{H * P, H * P, R * N, R * N, H, H, H, NA};
  int64_t cols = 0;
  for (int64_t w : widths) cols += w;
  auto params = layer.params();  // Wz Wx WB WC Wdt WA Wtrap Wang dt_bias B_norm C_norm B_bias C_bias D Wo [mimo]
  for (size_t k = 0, c0 = 0; k < widths.size(); c0 += widths[k], ++k)
    params[k]->value = columns_of(p["W_in"], Dm, cols, int64_t(c0), widths[k]);
  const std::vector<std::string> rest{"dt_bias", "wB", "wC", "B_bias", "C_bias", "D", "W_out", "mx", "mz", "mo"};
  for (size_t k = 8; k < params.size(); ++k) params[k]->value = tensor_of(p[rest[k - 8]], params[k]->value.shape());

  auto state_of = [&](const nlohmann::json& bd) {
    return State{tensor_of(bd["S"], {1, H, P, N}), tensor_of(bd["phi"], {1, H, NA}), tensor_of(bd["bp"], {1, H, R, N}),
                 tensor_of(bd["xp"], {1, H, R, P})};
  };
  ChunkCtx ctx;
  ctx.len = T, ctx.batch = 1;
  State out_state, din;
  std::unique_ptr<Stash> stash;
  for (Param* q : params) q->grad.zero_();
  Tensor out = layer.forward(ctx, tensor_of(c["u"], {T, Dm}), state_of(c["bd0"]), out_state, stash);
  Tensor du = layer.backward(ctx, tensor_of(c["dout"], {T, Dm}), state_of(c["dbd_T"]), din, *stash);

  const double tol = 1e-12;
  EXPECT_LE(max_rel_diff(out, tensor_of(c["out"], {T, Dm})), tol) << "output";
  State ref_out = state_of(c["bd_T"]), ref_din = state_of(c["dbd0"]);
  const char* names[] = {"S", "phi", "b_prev", "x_prev"};
  for (int i = 0; i < Mamba3Mixer::kStateSize; ++i) {
    if (i == Mamba3Mixer::kPhi)
      EXPECT_LE(angle_diff(out_state[i], ref_out[i]), 1e-12) << "final phi";
    else
      EXPECT_LE(max_rel_diff(out_state[i], ref_out[i]), tol) << "final " << names[i];
    EXPECT_LE(max_rel_diff(din[i], ref_din[i]), tol) << "initial-state gradient " << names[i];
  }
  EXPECT_LE(max_rel_diff(du, tensor_of(c["du"], {T, Dm})), tol) << "du";
  const auto& g = c["grads"];
  for (size_t k = 0, c0 = 0; k < widths.size(); c0 += widths[k], ++k)
    EXPECT_LE(max_rel_diff(params[k]->grad, columns_of(g["W_in"], Dm, cols, int64_t(c0), widths[k])), tol)
        << params[k]->name;
  for (size_t k = 8; k < params.size(); ++k)
    EXPECT_LE(max_rel_diff(params[k]->grad, tensor_of(g[rest[k - 8]], params[k]->grad.shape())), tol)
        << params[k]->name;
}

}  // namespace

TEST(Mamba3Reference, SisoMatchesTheNumpyOracle) { check_case(load_fixture()["siso"]); }

TEST(Mamba3Reference, MimoMatchesTheNumpyOracle) { check_case(load_fixture()["mimo"]); }
