#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "pipeline/chunk_partition.h"
#include "temp_dir.h"
#include "test_util.h"
#include "train/cost_calibration.h"
#include "train/planner.h"
#include "train/verify.h"

using namespace stateflow;
using namespace stateflow::testing;

namespace {

PassCosts kind(CostTerms forward, CostTerms backward, double stash, WorkTerms forward_work = {},
               WorkTerms backward_work = {}) {
  return {forward, backward, stash, {{forward_work, backward_work, stash}}};
}

// A hybrid's costs as a profile would give them: attention pays per query-key pair.
CostModel hybrid_costs() {
  CostModel c;
  c.kinds["embedding"] = kind({1e-5, 1e-8, 0}, {1e-5, 1e-8, 0}, 8);
  c.kinds["gdn_block"] = kind({5e-5, 4e-7, 0}, {1e-4, 1.2e-6, 0}, 400, {0, 64, 0}, {1 << 20, 128, 0});
  c.kinds["mlp_block"] = kind({2e-5, 3e-7, 0}, {4e-5, 6e-7, 0}, 300, {0, 96, 0}, {0, 96, 0});
  c.kinds["attention_block"] = kind({5e-5, 3e-7, 2e-10}, {1e-4, 6e-7, 5e-10}, 350, {0, 32, 8}, {0, 64, 16});
  c.kinds["lm_head"] = kind({2e-5, 5e-7, 0}, {4e-5, 1e-6, 0}, 200, {0, 0, 0}, {0, 512, 0});
  c.resident_bytes_per_parameter = 16;
  c.input_bytes_per_value = 4;
  return c;
}

PlanSpace hybrid_space() {
  PlanSpace s;
  s.model = resolve_model_config("tiny", "", "GGGAGGGA");
  s.stages = 2, s.batch = 4, s.seq_len = 8192, s.multiple = 64;
  return s;
}

}  // namespace

TEST(Planner, CostTableSumsEachStagesTermsPerChunk) {
  const CostModel c = hybrid_costs();
  const PlanSpace space = hybrid_space();
  const std::vector<PassCosts> stages = c.stage_costs(space.model, 2);
  Plan p;
  p.microbatches = 2, p.chunk_lengths = {4096, 2048, 2048};
  CostTable t = plan_cost_table(c, stages, space, p);
  ASSERT_EQ(t.forward_time.size(), 2u);
  EXPECT_DOUBLE_EQ(t.forward_time[1][1], stages[1].forward.at(2, 2048, 4096));
  EXPECT_DOUBLE_EQ(t.backward_time[0][2], stages[0].backward.at(2, 2048, 6144));
  EXPECT_EQ(t.unit_bytes[0][0][int(MemCategory::Activations)], int64_t(2 * 4096 * stages[0].stash_bytes_per_token));
  // Recomputation runs the forward again in the backward and keeps only the layers' inputs.
  p.recompute = true;
  t = plan_cost_table(c, stages, space, p);
  EXPECT_DOUBLE_EQ(t.backward_time[0][2], stages[0].backward.at(2, 2048, 6144) + stages[0].forward.at(2, 2048, 6144));
  EXPECT_LT(t.unit_bytes[0][0][int(MemCategory::Activations)], int64_t(2 * 4096 * stages[0].stash_bytes_per_token));
  // Each microbatch's K/V prefixes: one attention block per stage here.
  EXPECT_GT(t.kv_prefix_bytes[0], 0);
  EXPECT_EQ(t.kv_prefix_bytes[0], t.kv_prefix_bytes[1]);
}

// The search prices every alpha of the grid at each N and ranks them: the first is the grid's
// fastest, and rounding onto the same lengths is priced once.
TEST(Planner, RanksEveryPartitionOfTheGrid) {
  const CostModel c = hybrid_costs();
  PlanSpace space = hybrid_space();
  space.schedules = {"stateflow"}, space.microbatches = {2}, space.recompute = {false}, space.chunks = {8};
  const std::vector<Plan> ranked = search_plans(c, space);
  ASSERT_GE(ranked.size(), 5u);
  std::vector<std::vector<int64_t>> seen;
  for (size_t i = 0; i < ranked.size(); ++i) {
    EXPECT_EQ(ranked[i].chunks, 8);
    EXPECT_EQ(std::count(seen.begin(), seen.end(), ranked[i].chunk_lengths), 0);
    seen.push_back(ranked[i].chunk_lengths);
    if (i) {
      EXPECT_GE(ranked[i - 1].tokens_per_s, ranked[i].tokens_per_s);
    }
  }
  const std::vector<PassCosts> stages = c.stage_costs(space.model, 2);
  for (double alpha : partition_alphas()) {
    Plan p = ranked.front();
    p.chunk_lengths = alpha_partition(unit_cost(stages, false), 2, space.seq_len, 8, alpha, space.multiple);
    if (p.chunk_lengths.empty()) continue;
    predict_plan(c, stages, space, p);
    EXPECT_LE(ranked.front().step_s, p.step_s) << "alpha " << alpha;
  }
}

TEST(Planner, EverySchedulesGetsTheSameSearchAndTheMemoryLimit) {
  const CostModel c = hybrid_costs();
  PlanSpace space = hybrid_space();
  std::vector<Plan> ranked = search_plans(c, space);
  for (const std::string s : {"stateflow", "1f1b", "gpipe"}) {
    const Plan* best = best_plan(ranked, s);
    ASSERT_NE(best, nullptr) << s;
    if (s != "stateflow") {
      EXPECT_EQ(best->chunks, 1);
    }
  }
  // Baselines are searched over M and recompute like stateflow.
  int baseline_shapes = 0;
  for (const Plan& p : ranked) baseline_shapes += p.schedule == "1f1b";
  EXPECT_EQ(baseline_shapes, 3 * 2);  // M in {1, 2, 4}, recompute off and on
  // A limit below the smallest peak leaves nothing that fits, and says so in the ranking.
  int64_t smallest = ranked.front().peak_total();
  for (const Plan& p : ranked) smallest = std::min(smallest, p.peak_total());
  space.memory_bytes = double(smallest) - 1;
  ranked = search_plans(c, space);
  for (const Plan& p : ranked) EXPECT_FALSE(p.fits);
  EXPECT_EQ(best_plan(ranked, "stateflow"), nullptr);
  space.memory_bytes = double(smallest);
  ranked = search_plans(c, space);
  EXPECT_TRUE(ranked.front().fits);
  EXPECT_LE(ranked.front().peak_total(), smallest);
}

// Each action's working memory is its stage's largest layer's at the chunk's shape; stages
// sharing one device run one action at a time and their memory adds up against the limit.
TEST(Planner, WorkingMemoryAndSharedDevice) {
  const CostModel c = hybrid_costs();
  PlanSpace space = hybrid_space();
  const std::vector<PassCosts> stages = c.stage_costs(space.model, 2);
  Plan p;
  p.microbatches = 2, p.chunk_lengths = {4096, 2048, 2048};
  const CostTable t = plan_cost_table(c, stages, space, p);
  EXPECT_EQ(t.forward_work_bytes[0][1], int64_t(2 * 2048 * 96));                // the MLP's
  EXPECT_EQ(t.backward_work_bytes[1][2], int64_t(2 * 2048 * 512));               // the LM head's
  EXPECT_EQ(t.backward_work_bytes[0][0], int64_t((1 << 20) + 2 * 4096 * 128));  // G's, with its fixed part
  p.recompute = true;
  EXPECT_EQ(plan_cost_table(c, stages, space, p).backward_work_bytes[0][0],
            int64_t((1 << 20) + 2 * 4096 * 128 + 2 * 4096 * 400));  // and G's recomputed stash
  p.recompute = false;
  predict_plan(c, stages, space, p);
  EXPECT_GT(p.stage_peak_bytes[0][int(MemCategory::Other)], 0);
  // One device: the step is every action's time, memory the stages' sum.
  space.shared_device = true;
  Plan shared = p;
  predict_plan(c, stages, space, shared);
  double busy = 0;
  for (size_t r = 0; r < 2; ++r)
    for (size_t k = 0; k < 3; ++k) busy += 2 * (t.forward_time[r][k] + t.backward_time[r][k]);
  EXPECT_NEAR(shared.step_s, busy, 1e-12 * busy);
  EXPECT_GT(shared.step_s, p.step_s);
  EXPECT_EQ(shared.peak_total(), shared.stage_peak_total[0] + shared.stage_peak_total[1]);
  space.memory_bytes = double(shared.peak_total()) - 1;
  predict_plan(c, stages, space, shared);
  EXPECT_FALSE(shared.fits);
  // One device split by SMs (--sm-split): the stages run side by side, as on devices of their
  // own, but their memory still adds up against the one device's limit.
  space.shared_device = false, space.split_sms = true;
  Plan split = p;
  predict_plan(c, stages, space, split);
  EXPECT_EQ(split.step_s, p.step_s);
  EXPECT_EQ(split.peak_total(), split.stage_peak_total[0] + split.stage_peak_total[1]);
  EXPECT_FALSE(split.fits);
  EXPECT_EQ(profile_options(space).sm_parts, 2) << "a split stage is profiled on its part of the SMs";
  space.split_sms = false;
  EXPECT_EQ(profile_options(space).sm_parts, 1);
}

// The longest sequence of a schedule: it fits, one multiple more does not; stateflow's chunks
// fit longer sequences than 1f1b's whole ones.
TEST(Planner, LongestFittingSeqLen) {
  const CostModel c = hybrid_costs();
  PlanSpace space = hybrid_space();
  space.recompute = {false};
  space.memory_bytes = 64.0 * (1 << 20);
  const int64_t limit = int64_t(1) << 22;
  std::map<std::string, int64_t> longest;
  for (const std::string s : {"stateflow", "1f1b"}) {
    const int64_t T = longest[s] = longest_fitting_seq_len(c, space, s, limit);
    ASSERT_GT(T, 0) << s;
    ASSERT_LT(T, limit) << s;
    EXPECT_EQ(T % space.multiple, 0);
    PlanSpace at = space;
    at.schedules = {s}, at.seq_len = T;
    EXPECT_NE(best_plan(search_plans(c, at), s), nullptr) << s;
    at.seq_len = T + space.multiple;
    EXPECT_EQ(best_plan(search_plans(c, at), s), nullptr) << s;
  }
  EXPECT_GT(longest["stateflow"], longest["1f1b"]);
  space.memory_bytes = 0;
  EXPECT_THROW(longest_fitting_seq_len(c, space, "1f1b", limit), Error);
}

TEST(Planner, PlanFileGivesItsChunkLengthsChecked) {
  TempDir dir;
  const CostModel c = hybrid_costs();
  const PlanSpace space = hybrid_space();
  const std::vector<Plan> ranked = search_plans(c, space);
  std::ofstream(dir / "plan.json") << plan_json(ranked.front(), space).dump();
  EXPECT_EQ(chunk_lengths_from_plan_file(dir / "plan.json", 8192), ranked.front().chunk_lengths);
  EXPECT_THROW(chunk_lengths_from_plan_file(dir / "plan.json", 4096), Error);
  EXPECT_THROW(chunk_lengths_from_plan_file(dir / "missing.json", 8192), Error);
  std::ofstream(dir / "other.json") << "{\"steps\": 3}";
  EXPECT_THROW(chunk_lengths_from_plan_file(dir / "other.json", 8192), Error);
}

// Every partition the planner can choose keeps training exact: float64, pipelined, chunked
// with the generated lengths, against one stage and one chunk.
TEST(Planner, GeneratedPartitionsAreExact) {
  VerifyOptions o;
  o.model = resolve_model_config("tiny", "", "GA|AG");
  o.stages = 2, o.microbatches = 2, o.batch = 2, o.seq_len = 90;
  const CostTerms steep{1e-5, 1e-7, 5e-8};  // attention-heavy: balanced lengths differ a lot
  for (double alpha : partition_alphas())
    for (int N : {3, 5})
      if (auto l = alpha_partition(steep, 1, o.seq_len, N, alpha, 1); !l.empty()) o.chunkings.push_back(l);
  ASSERT_GE(o.chunkings.size(), 10u);
  const VerifyResult r = run_verify(o);
  EXPECT_TRUE(r.passed());
  EXPECT_LE(r.max_rel_grad_diff, 1e-10);
}

// A run whose layers take 2x the profile's linear part and 3x its pair part, with 1 ms per
// message between stages: one measured run recovers all three, and then predicts other
// partitions as the truth would.
TEST(CostCalibration, RecoversMeasuredFactorsAndMessageLatency) {
  const CostModel profiled = hybrid_costs();
  CostModel truth = profiled;
  for (auto& [kind, p] : truth.kinds)
    for (CostTerms* t : {&p.forward, &p.backward}) *t = {2 * t->fixed, 2 * t->per_token, 3 * t->per_pair};
  PlanSpace space = hybrid_space();
  PlanSpace true_space = space;
  true_space.message_s = 1e-3;
  const std::vector<PassCosts> true_stages = truth.stage_costs(space.model, 2);
  Plan run;
  run.microbatches = 2, run.chunk_lengths = std::vector<int64_t>(8, 1024);
  const CostTable measured = plan_cost_table(truth, true_stages, true_space, run);
  predict_plan(truth, true_stages, true_space, run);

  CostCalibration calibration(profiled, space);
  calibration.add(run, measured, run.step_s);
  const std::vector<PassCosts> fitted = calibration.stages(), before = profiled.stage_costs(space.model, 2);
  for (int r = 0; r < 2; ++r) {
    EXPECT_NEAR(fitted[size_t(r)].forward.per_token, 2 * before[size_t(r)].forward.per_token,
                1e-9 * before[size_t(r)].forward.per_token);
    EXPECT_NEAR(fitted[size_t(r)].backward.per_pair, 3 * before[size_t(r)].backward.per_pair,
                1e-9 * before[size_t(r)].backward.per_pair);
  }
  EXPECT_NEAR(calibration.space().message_s, 1e-3, 1e-9);
  Plan other;
  other.microbatches = 4, other.recompute = true;
  other.chunk_lengths = alpha_partition(unit_cost(fitted, true), 1, space.seq_len, 4, 1.0, 64);
  Plan expected = other;
  calibration.predict(other);
  predict_plan(truth, true_stages, true_space, expected);
  EXPECT_NEAR(other.step_s, expected.step_s, 1e-9 * expected.step_s);
}

// Stages sharing one device: each action's measured time holds the other stage's interleaved
// work too (here 1.8x), so the calibration keeps the profile's shape scaled to the measured
// step, and predicts other partitions of the same device as the truth.
TEST(CostCalibration, SharedDeviceScalesToTheMeasuredStep) {
  const CostModel profiled = hybrid_costs();
  PlanSpace space = hybrid_space();
  space.shared_device = true;
  const std::vector<PassCosts> stages = profiled.stage_costs(space.model, 2);
  std::vector<PassCosts> truth = stages;
  for (PassCosts& t : truth) t.forward = t.forward.scaled(1.3), t.backward = t.backward.scaled(1.3);
  Plan run;
  run.microbatches = 2, run.chunk_lengths = std::vector<int64_t>(4, 2048);
  CostTable measured = plan_cost_table(profiled, truth, space, run);
  for (auto* pass : {&measured.forward_time, &measured.backward_time})
    for (auto& stage : *pass)
      for (double& t : stage) t *= 1.8;
  predict_plan(profiled, truth, space, run);
  CostCalibration calibration(profiled, space);
  calibration.add(run, measured, run.step_s);
  EXPECT_EQ(calibration.space().message_s, 0);
  Plan other;
  other.microbatches = 1, other.chunk_lengths = alpha_partition(unit_cost(stages, false), 4, space.seq_len, 8, 1.0, 64);
  Plan expected = other;
  calibration.predict(other);
  predict_plan(profiled, truth, space, expected);
  EXPECT_NEAR(other.step_s, expected.step_s, 1e-9 * expected.step_s);
}
