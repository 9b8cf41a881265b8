// The FLOP count of MATH.md section 9: a block's matrices against the parameter count, the
// GDN core against MATH.md's figure, and whole models against reference/cost_model.py's numbers.
#include <gtest/gtest.h>

#include "mixers/gdn/gdn_config.h"
#include "model/flops.h"

using namespace stateflow;

TEST(Flops, BlockFlopsCountTheMatricesAndTheGdnCore) {
  // Reference: the block's weight matrices from the parameter count, less the vectors.
  const ModelConfig m = model_preset("gdn-1.3b");
  const GdnConfig g = gdn_config(m);
  const int64_t hk = g.heads * g.head_dk, hv = g.heads * g.head_dv;
  ModelConfig one = m, two = m;
  one.pattern = "G", two.pattern = "GG";
  const int64_t block = two.num_parameters() - one.num_parameters();
  const double matrices = double(block - (2 * hk + hv) * g.conv_size - 2 * g.heads - g.head_dv - 2 * m.d_model);
  const double C = double(g.block_size), dk = double(g.head_dk), dv = double(g.head_dv);
  const BlockFlops f = block_flops_per_token(m, 'G', 4096);
  EXPECT_DOUBLE_EQ(f.forward(), 2 * matrices + g.heads * (6 * dk * dv + 2 * C * (3 * dk + 2 * dv) + 2 * C * C / 3));
  EXPECT_DOUBLE_EQ(f.backward(), 4 * matrices + g.heads * (18 * dk * dv + 18 * C * dk + 10 * C * dv + 4 * C * C));
  // MATH.md's count for gdn-1.3b: 0.278 GFLOP of GDN core per token over 24 layers (fwd + bwd).
  EXPECT_NEAR(24 * g.heads * (6 * dk * dv + 2 * C * (3 * dk + 2 * dv) + 2 * C * C / 3 + 18 * dk * dv +
                              18 * C * dk + 10 * C * dv + 4 * C * C) / 1e9,
              0.278, 0.001);
}

TEST(Flops, ModelFlopsPerTokenAreThoseOfTheCostModel) {
  // reference/cost_model.py: L x (dense_linear of the GDN in- and out-projections and the three
  // MLP matrices) + dense_linear(D, V), and L x gdn_core(H, dk, dv, C), fwd + bwd.
  const ModelFlops big = model_flops_per_token(model_preset("gdn-1.3b"), 4096);
  EXPECT_DOUBLE_EQ(big.dense, 8405385216.0);
  EXPECT_DOUBLE_EQ(big.core, 277872640.0);
  EXPECT_DOUBLE_EQ(big.total(), 8405385216.0 + 277872640.0);
  ModelConfig c;  // a small model of GPU shapes (heads of 128, C = 64)
  c.vocab_size = 512, c.d_model = 256, c.pattern = "GG", c.mlp_hidden = 512;
  c.mixers["gdn"] = {{"heads", 2}, {"head_dk", 128}, {"head_dv", 128}, {"block_size", 64}};
  c.complete_sections();
  const ModelFlops small = model_flops_per_token(c, 4096);
  EXPECT_DOUBLE_EQ(small.dense, 9449472.0);
  EXPECT_NEAR(small.core, 2894506.6666666665, 1e-6);
}

TEST(Flops, AttentionCoreGrowsWithTheKeysATokenSees) {
  // hybrid-1.3b's attention block: q.k and p.v are 2 x head_dim FLOPs per key and query head
  // each forward; backward (dV, dP, dQ, dK) twice that. A causal sequence of T tokens shows
  // its tokens (T + 1) / 2 keys on average.
  const ModelConfig m = model_preset("hybrid-1.3b");
  const nlohmann::json& a = m.mixers.at("attention");
  const double qwidth = a.at("heads").get<double>() * a.at("head_dim").get<double>();
  const BlockFlops one = block_flops_per_token(m, 'A', 1), long_seq = block_flops_per_token(m, 'A', 32767);
  EXPECT_DOUBLE_EQ(one.core_forward, 4 * qwidth);
  EXPECT_DOUBLE_EQ(long_seq.core_forward, 16384 * 4 * qwidth);
  EXPECT_DOUBLE_EQ(long_seq.core_backward, 16384 * 8 * qwidth);
  EXPECT_DOUBLE_EQ(long_seq.matrices_forward, one.matrices_forward);
  // Recurrent blocks have no per-key term.
  EXPECT_DOUBLE_EQ(block_flops_per_token(m, 'G', 1).core_forward, block_flops_per_token(m, 'G', 32767).core_forward);
  EXPECT_GT(model_flops_per_token(m, 32768).core, model_flops_per_token(m, 4096).core);
}
