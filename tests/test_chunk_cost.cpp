#include <gtest/gtest.h>

#include "core/error.h"
#include "model/config.h"
#include "pipeline/chunk_cost.h"
#include "test_util.h"

using namespace stateflow;
using stateflow::testing::fresh_seed;

namespace {

// Samples of a known cost at the profile's shapes: chunk lengths and prefixes of a sequence.
std::vector<CostSample> samples_of(const CostTerms& truth, double b, double noise, Rng& rng) {
  std::vector<CostSample> out;
  for (double s : {64.0, 256.0, 1024.0})
    for (double c : {0.0, 1024.0, 4096.0}) out.push_back({b, s, c, truth.at(b, s, c) * (1 + noise * rng.normal())});
  return out;
}

}  // namespace

TEST(ChunkCost, FitReproducesSyntheticCosts) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(cat("seed ", seed));
  Rng rng(seed);
  for (int trial = 0; trial < 20; ++trial) {
    const CostTerms truth{1e-4 * (1 + rng.uniform()), 1e-7 * (1 + rng.uniform()),
                          trial % 2 ? 1e-10 * (1 + rng.uniform()) : 0.0};
    const double b = 1 + trial % 3;
    const CostTerms fit = fit_cost_terms(samples_of(truth, b, 0, rng), truth.per_pair > 0);
    EXPECT_NEAR(fit.fixed, truth.fixed, 1e-9 * truth.fixed + 1e-15);
    EXPECT_NEAR(fit.per_token, truth.per_token, 1e-9 * truth.per_token);
    EXPECT_NEAR(fit.per_pair, truth.per_pair, 1e-9 * truth.per_pair + 1e-22);
    // Shapes the profile never ran are priced by the same terms.
    EXPECT_NEAR(fit.at(b, 3000, 9000), truth.at(b, 3000, 9000), 1e-9 * truth.at(b, 3000, 9000));
  }
}

TEST(ChunkCost, FitWithNoiseStaysClose) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(cat("seed ", seed));
  Rng rng(seed);
  const CostTerms truth{2e-4, 3e-7, 5e-11};
  const CostTerms fit = fit_cost_terms(samples_of(truth, 2, 0.01, rng), true);
  for (double s : {128.0, 2048.0})
    for (double c : {0.0, 8192.0}) EXPECT_NEAR(fit.at(2, s, c) / truth.at(2, s, c), 1, 0.05);
}

TEST(ChunkCost, TermsNeverNegative) {
  // A cost that falls with the chunk length has no non-negative linear term: the fit keeps
  // the fixed term and gives the others 0 rather than a negative rate.
  std::vector<CostSample> falling{{1, 64, 0, 3.0}, {1, 256, 0, 2.0}, {1, 1024, 0, 1.0}};
  const CostTerms fit = fit_cost_terms(falling, true);
  EXPECT_GE(fit.fixed, 0);
  EXPECT_EQ(fit.per_token, 0);
  EXPECT_EQ(fit.per_pair, 0);
  EXPECT_GT(fit.fixed, 1.0);
  // Without pairs allowed, a quadratic cost is explained by the other terms only.
  std::vector<CostSample> quad{{1, 64, 0, 1}, {1, 128, 64, 9}, {1, 256, 192, 60}};
  EXPECT_EQ(fit_cost_terms(quad, false).per_pair, 0);
}

TEST(ChunkCost, BadSamplesAreRefused) {
  EXPECT_THROW(fit_cost_terms({}, true), Error);
  EXPECT_THROW(fit_cost_terms({{1, 64, 0, -1.0}}, true), Error);
  EXPECT_THROW(fit_cost_terms({{1, 0, 0, 1.0}}, true), Error);
}

TEST(ChunkCost, StageCostsSumTheirLayers) {
  const ModelConfig m = resolve_model_config("tiny", "", "GA|AG");
  CostModel cm;
  cm.kinds["embedding"] = {{1, 0, 0}, {2, 0, 0}, 0};
  cm.kinds["gdn_block"] = {{0, 1, 0}, {0, 3, 0}, 10};
  cm.kinds["attention_block"] = {{0, 1, 1}, {0, 2, 3}, 20};
  cm.kinds["mlp_block"] = {{0, 2, 0}, {0, 4, 0}, 5};
  cm.kinds["lm_head"] = {{5, 0, 0}, {6, 0, 0}, 1};
  const std::vector<PassCosts> st = cm.stage_costs(m, 2);
  ASSERT_EQ(st.size(), 2u);
  // Stage 0: embedding, G, mlp, A, mlp. Stage 1: A, mlp, G, mlp, head.
  EXPECT_EQ(st[0].forward.fixed, 1);
  EXPECT_EQ(st[0].forward.per_token, 1 + 2 + 1 + 2);
  EXPECT_EQ(st[0].backward.per_pair, 3);
  EXPECT_EQ(st[0].stash_bytes_per_token, 10 + 5 + 20 + 5);
  EXPECT_EQ(st[1].forward.fixed, 5);
  EXPECT_EQ(st[1].backward.fixed, 6);
  EXPECT_EQ(st[1].stash_bytes_per_token, 20 + 5 + 10 + 5 + 1);
  cm.kinds.erase("attention_block");
  EXPECT_THROW(cm.stage_costs(m, 2), Error);
}

TEST(ChunkCost, WorkFitReproducesSyntheticBytes) {
  const WorkTerms truth{32.0 * (1 << 20), 6144, 512};
  std::vector<CostSample> samples;
  for (double s : {2048.0, 4096.0, 16384.0})
    for (double c : {0.0, 8192.0, 16384.0}) samples.push_back({2, s, c, truth.at(2, s, c)});
  const WorkTerms fit = fit_work_terms(samples);
  EXPECT_NEAR(fit.fixed, truth.fixed, 1e-6 * truth.fixed);
  EXPECT_NEAR(fit.per_token, truth.per_token, 1e-6 * truth.per_token);
  EXPECT_NEAR(fit.per_prefix, truth.per_prefix, 1e-6 * truth.per_prefix);
  EXPECT_THROW(fit_work_terms({}), Error);
  EXPECT_THROW(fit_work_terms({{1, 64, 0, -1.0}}), Error);
}

// A stage's layers run one at a time: its working memory is its largest kind's, and under
// recomputation that layer's stash comes on top of the larger of its two passes.
TEST(ChunkCost, StageWorkIsItsLargestLayers) {
  const ModelConfig m = resolve_model_config("tiny", "", "GA|AG");
  CostModel cm;
  auto kind = [](double stash, WorkTerms f, WorkTerms b) { return PassCosts{{1, 0, 0}, {1, 0, 0}, stash, {{f, b, stash}}}; };
  cm.kinds["embedding"] = kind(0, {10, 0, 0}, {20, 0, 0});
  cm.kinds["gdn_block"] = kind(4, {0, 3, 0}, {0, 5, 0});
  cm.kinds["attention_block"] = kind(2, {0, 1, 1}, {0, 2, 2});
  cm.kinds["mlp_block"] = kind(1, {0, 2, 0}, {0, 1, 0});
  cm.kinds["lm_head"] = kind(0, {0, 0, 0}, {100, 0, 0});
  const std::vector<PassCosts> st = cm.stage_costs(m, 2);
  ASSERT_EQ(st.size(), 2u);
  EXPECT_EQ(st[0].work.size(), 4u);  // embedding, G, mlp, A: each kind once
  EXPECT_EQ(st[0].forward_work_bytes(1, 10, 0), 30);     // G: 3 per token
  EXPECT_EQ(st[0].forward_work_bytes(1, 10, 100), 110);  // A: 1 per token and per prefix token
  EXPECT_EQ(st[0].backward_work_bytes(1, 10, 0, false), 50);
  EXPECT_EQ(st[0].backward_work_bytes(1, 10, 0, true), 4 * 10 + 50);  // G's stash + its backward
  EXPECT_EQ(st[1].backward_work_bytes(2, 10, 0, false), 100);         // the LM head's fixed scratch
}
