#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "core/error.h"
#include "temp_dir.h"
#include "test_util.h"
#include "model/model.h"
#include "pipeline/stage_executor.h"
#include "pipeline/units.h"
#include "train/cost_profile.h"

using namespace stateflow;
using namespace stateflow::testing;

TEST(CostProfile, ChunkingsSpanTheSequence) {
  for (int64_t T : {int64_t(1), int64_t(100), int64_t(4096), int64_t(131072)})
    for (const auto& l : profile_chunkings(T, 64)) {
      EXPECT_EQ(std::accumulate(l.begin(), l.end(), int64_t(0)), T);
      for (int64_t s : l) EXPECT_GE(s, 1);
    }
  // Long chunks early, long chunks late: lengths and prefixes vary independently.
  const auto c = profile_chunkings(4096, 64);
  EXPECT_GT(c[0].front(), c[0].back());
  EXPECT_LT(c[1].front(), c[1].back());
}

// A real profile of a small hybrid on the CPU: every layer kind is measured and fitted, only
// attention gets a pair term, and the cache gives it back without measuring again.
TEST(CostProfile, ProfilesEveryLayerKindAndCaches) {
  TempDir dir;
  ProfileOptions o;
  o.model = resolve_model_config("tiny", "", "GA|AG");
  o.seq_len = 256, o.batch = 2, o.multiple = 8;
  std::ostringstream log;
  const CostModel c = cached_cost_model(o, dir.path.string(), log);
  for (const char* kind : {"embedding", "gdn_block", "attention_block", "mlp_block", "lm_head"}) {
    ASSERT_TRUE(c.kinds.count(kind)) << kind;
    const PassCosts& p = c.kinds.at(kind);
    EXPECT_GT(p.forward.at(2, 128, 128) + p.backward.at(2, 128, 128), 0) << kind;
    if (std::string(kind) != "attention_block") {
      EXPECT_EQ(p.forward.per_pair + p.backward.per_pair, 0) << kind;
    }
  }
  EXPECT_GT(c.kinds.at("gdn_block").stash_bytes_per_token, 0);
  // Working memory: every kind's backward holds scratch (gradients on their way) above what
  // it holds before and after.
  for (const char* kind : {"gdn_block", "attention_block", "mlp_block", "lm_head"})
    EXPECT_GT(c.kinds.at(kind).backward_work_bytes(2, 128, 128, false), 0) << kind;
  EXPECT_NEAR(c.resident_bytes_per_parameter, 16, 1e-9);  // f32 weights, grads and two AdamW moments
  EXPECT_NE(log.str().find("measuring"), std::string::npos) << log.str();
  std::ostringstream again;
  const CostModel cached = cached_cost_model(o, dir.path.string(), again);
  EXPECT_NE(again.str().find("(cached)"), std::string::npos) << again.str();
  EXPECT_EQ(cost_model_json(cached), cost_model_json(c));
  // The cache file is a recorded profile another machine can plan with.
  nlohmann::json key;
  EXPECT_EQ(cost_model_json(cost_model_from_file(cost_profile_path(o, dir.path.string()), &key)), cost_model_json(c));
  EXPECT_EQ(key.at("model"), o.model.to_json());
  EXPECT_THROW(cost_model_from_file(dir / "missing.json"), Error);
  // A recorded profile prices a run measured the same way: its model, device and SM split.
  const std::string file = cost_profile_path(o, dir.path.string());
  std::ostringstream read;
  EXPECT_EQ(cost_model_json(recorded_cost_model(file, o, read)), cost_model_json(c));
  EXPECT_NE(read.str().find("(recorded: cpu"), std::string::npos) << read.str();
  ProfileOptions split = o;
  split.sm_parts = 2;
  expect_error([&] { recorded_cost_model(file, split, read); }, "was measured on the whole device, but this run splits "
                                                                "the SMs 2 ways (--sm-split, --stages 2)");
  ProfileOptions other = o;
  other.model = resolve_model_config("small", "", "");
  expect_error([&] { recorded_cost_model(file, other, read); }, "whose layers are not this one's");
  // Another shape is another key, and so is a profile on part of the SMs.
  o.batch = 1;
  EXPECT_NE(cost_profile_path(o, "d"), cost_profile_path(ProfileOptions{}, "d"));
  ProfileOptions whole = split;
  whole.sm_parts = 1;
  EXPECT_NE(cost_profile_path(split, "d"), cost_profile_path(whole, "d"));
}

TEST(CostProfile, NotACostModelIsAnErrorNamingTheFile) {
  EXPECT_THROW(cost_model_from_json(nlohmann::json{{"kinds", 3}}, "x.json"), Error);
}

// A profile prices a model when every layer kind it has was profiled at its shapes.
TEST(CostProfile, PricesModelsOfTheSameLayers) {
  const nlohmann::json hybrid = resolve_model_config("hybrid-1.3b", "", "").to_json();
  EXPECT_TRUE(profile_prices_model(hybrid, model_preset("hybrid-1.3b")));
  EXPECT_TRUE(profile_prices_model(hybrid, model_preset("gdn-1.3b")));  // its G blocks, MLPs, head
  EXPECT_FALSE(profile_prices_model(hybrid, model_preset("mamba3-1.3b")));  // no M layers profiled
  EXPECT_FALSE(profile_prices_model(hybrid, model_preset("gdn-3b")));        // other widths
  EXPECT_FALSE(profile_prices_model(model_preset("gdn-1.3b").to_json(), model_preset("hybrid-1.3b")));
  EXPECT_FALSE(profile_prices_model(nlohmann::json(), model_preset("gdn-1.3b")));
}

// A profile recorded before a config field existed (gdn.value_heads came later) lacks it: the
// field takes its default there, so the profile still prices the model; a real difference is named.
TEST(CostProfile, AFieldAddedSinceTheProfileTakesItsDefault) {
  nlohmann::json older = model_preset("hybrid-1.3b").to_json();
  ASSERT_TRUE(older["gdn"].contains("value_heads"));
  older["gdn"].erase("value_heads");
  EXPECT_TRUE(profile_prices_model(older, model_preset("hybrid-1.3b")));
  older["gdn"]["heads"] = 8;
  const std::string why = profile_model_mismatch(older, model_preset("hybrid-1.3b"));
  EXPECT_NE(why.find("'gdn'"), std::string::npos) << why;
  EXPECT_NE(why.find("\"heads\":8"), std::string::npos) << why;
}

// The profile's stash per token, summed over a stage's layers, is what a stage of those layers
// keeps for one unit: each layer's own activations and the inputs it holds on to (in a stage,
// the previous layer's output).
TEST(CostProfile, StashAddsUpToAStagesStash) {
  TempDir dir;
  ProfileOptions o;
  o.model = resolve_model_config("tiny", "", "GAGA");
  o.seq_len = 256, o.batch = 2, o.multiple = 8;
  std::ostringstream log;
  const CostModel c = cached_cost_model(o, dir.path.string(), log);
  const int n = Model::num_layers_of(o.model);
  Model model(o.model, o.dtype, 0, n, Device::CPU);
  StageExecutor stage(model.layers(0, n), 0);
  Batch batch;
  batch.batch = 2, batch.seq_len = 256;
  for (int64_t i = 0; i < 2 * 256; ++i) batch.tokens.push_back(int32_t(i % 40)), batch.targets.push_back(int32_t((i + 1) % 40));
  LossStats stats;
  const UnitPlan plan(batch, 1, {256});
  const Unit unit = plan.make_unit(0, 0, &stats);
  stage.forward(unit.ctx, unit.tokens);
  double predicted = 0;
  for (const std::string& kind : layer_kinds(o.model)) predicted += c.kinds.at(kind).stash_bytes_per_token * 2 * 256;
  EXPECT_NEAR(double(stage.stash_bytes()), predicted, 0.02 * predicted);
}
