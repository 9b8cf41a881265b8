// Simulated depth: predictions at the measured depth reproduce the run's own simulated bubble
// and memory; deeper predictions and another model's follow the cost model of bench_depth.h.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "test_util.h"
#include "train/bench_depth.h"

using namespace stateflow;

static BenchOptions options(uint64_t seed) {
  BenchOptions o;
  o.model = model_preset("tiny");
  o.model.pattern = "GGGGGGGG";  // room for 8 stages
  o.model.vocab_size = 8192;  // an LM head of dozens of blocks' work: its measured share is clearly positive
  o.model.seed = seed, o.data.seed = seed;
  o.dtype = DType::F64;
  o.batch = 2, o.seq_len = 64, o.stages = 2, o.microbatches = 2;
  o.warmup_steps = 0, o.steps = 1;
  o.chunk_sweep = {2, 4};
  return o;
}

TEST(BenchDepth, AtTheMeasuredDepthPredictionsReproduceTheRun) {
  const uint64_t seed = stateflow::testing::fresh_seed();
  SCOPED_TRACE(seed);
  BenchOptions o = options(seed);
  o.simulate_stages = {2, 4, 8};
  BenchResult r = run_bench(o);
  DepthPredictions d = predict_depths(r, o, o.model);
  ASSERT_EQ(r.rows.size(), 3u);
  ASSERT_EQ(d.rows.size(), 9u);
  EXPECT_FALSE(d.scaled);
  for (size_t i = 0; i < r.rows.size(); ++i) {
    const BenchRow& run = r.rows[i];
    const DepthPrediction& p = d.rows[i];  // P = 2: the measured shape
    EXPECT_EQ(p.stages, 2);
    EXPECT_EQ(p.schedule, run.schedule);
    EXPECT_EQ(p.chunks, run.chunks());
    // Both stages hold 4 blocks, so the head's time is stage 1's less stage 0's; when a
    // descheduled thread made that negative somewhere, it counts 0 and the costs differ.
    bool head_positive = true;
    for (int c = 0; c < run.chunks(); ++c)
      head_positive = head_positive && run.costs.forward_time[1][c] >= run.costs.forward_time[0][c] &&
                      run.costs.backward_time[1][c] >= run.costs.backward_time[0][c];
    if (head_positive)
      EXPECT_NEAR(p.bubble, run.bubble_simulated, 1e-9) << run.schedule << " N=" << run.chunks();
    else
      std::printf("%s N=%d: a timing spike made the measured head time negative; bubble not compared\n",
                  run.schedule.c_str(), run.chunks());
    EXPECT_NEAR(p.tokens_per_s * p.step_s, double(o.batch * o.seq_len), 1e-6);
    // Each stage's memory is what was measured there: weights, grads and optimizer state
    // follow the parameters, the transient memory is the stage's own, and the stash is the
    // units in flight times the measured stash of a unit.
    for (int s = 0; s < 2; ++s)
      EXPECT_NEAR(double(p.stage_peak_bytes[s]), double(run.stage_memory[s].total_peak),
                  0.02 * double(run.stage_memory[s].total_peak))
          << run.schedule << " N=" << run.chunks() << " stage " << s;
    EXPECT_NEAR(double(p.peak_bytes), double(run.peak_bytes()), 0.02 * double(run.peak_bytes()))
        << run.schedule << " N=" << run.chunks();
    EXPECT_FALSE(p.oom);
  }
  for (const DepthPrediction& p : d.rows) EXPECT_EQ(p.stage_peak_bytes.size(), size_t(p.stages));
  // Per P, one best stateflow prediction, the fastest.
  for (int P : o.simulate_stages) {
    int marked = 0;
    double fastest = 0, best = -1;
    for (const DepthPrediction& p : d.rows)
      if (p.stages == P && p.schedule == "stateflow") {
        marked += p.best, fastest = std::max(fastest, p.tokens_per_s);
        if (p.best) best = p.tokens_per_s;
      }
    EXPECT_EQ(marked, 1) << "P=" << P;
    EXPECT_EQ(best, fastest) << "P=" << P;
  }
  // 1f1b with M = 2 whole sequences on 8 stages idles most of the time: bubble (P-1)/(M+P-1)
  // when stages cost alike; with the head on the last stage it is near that.
  const DepthPrediction& deep_1f1b = d.rows[6];
  ASSERT_EQ(deep_1f1b.stages, 8);
  EXPECT_GT(deep_1f1b.bubble, 0.5);

  std::ostringstream out;
  print_depth_predictions(d, o, out);
  EXPECT_EQ(out.str().rfind("PREDICTED, not measured", 0), 0u) << out.str();
  nlohmann::json j = depth_predictions_json(d, o);
  EXPECT_TRUE(j["predicted"].get<bool>());
  EXPECT_EQ(j["rows"].size(), 9u);
}

TEST(BenchDepth, AGpuMemoryLimitMarksPredictionsOom) {
  const uint64_t seed = stateflow::testing::fresh_seed();
  SCOPED_TRACE(seed);
  BenchOptions o = options(seed);
  o.simulate_stages = {4};
  BenchResult r = run_bench(o);
  o.gpu_memory_bytes = 1e12;
  DepthPredictions fits = predict_depths(r, o, o.model);
  int64_t least = fits.rows[0].peak_bytes, most = least;
  for (const DepthPrediction& p : fits.rows) {
    EXPECT_FALSE(p.oom);
    least = std::min(least, p.peak_bytes), most = std::max(most, p.peak_bytes);
  }
  ASSERT_LT(least, most);
  o.gpu_memory_bytes = double(least + most) / 2;  // some fit, some do not
  for (const DepthPrediction& p : predict_depths(r, o, o.model).rows)
    EXPECT_EQ(p.oom, double(p.peak_bytes) > o.gpu_memory_bytes);
}

TEST(BenchDepth, ABiggerModelScalesTheMeasuredCostsByFlopsAndWidth) {
  const uint64_t seed = stateflow::testing::fresh_seed();
  SCOPED_TRACE(seed);
  BenchOptions o = options(seed);
  o.simulate_stages = {2};
  BenchResult r = run_bench(o);
  const DepthPredictions same = predict_depths(r, o, o.model);
  ModelConfig wide = o.model;
  wide.d_model *= 2, wide.mlp_hidden *= 2;  // same layers, twice the width
  wide.mixers["gdn"]["heads"] = 2 * wide.mixers["gdn"]["heads"].get<int64_t>();
  const DepthPredictions d = predict_depths(r, o, wide);
  EXPECT_TRUE(d.scaled);
  const BlockFlops f0 = block_flops_per_token(o.model, 'G', o.seq_len), f1 = block_flops_per_token(wide, 'G', o.seq_len);
  EXPECT_DOUBLE_EQ(d.forward_ratio, f1.forward() / f0.forward());
  EXPECT_DOUBLE_EQ(d.backward_ratio, f1.backward() / f0.backward());
  EXPECT_DOUBLE_EQ(d.head_ratio, 2.0);
  EXPECT_DOUBLE_EQ(d.width_ratio, 2.0);  // every width doubled
  ASSERT_EQ(d.rows.size(), same.rows.size());
  for (size_t i = 0; i < d.rows.size(); ++i) {
    EXPECT_GT(d.rows[i].step_s, same.rows[i].step_s);
    EXPECT_GT(d.rows[i].peak_bytes, same.rows[i].peak_bytes);
  }
}

TEST(BenchDepth, ImpossibleTargetsAreRefusedBeforeAnythingRuns) {
  BenchOptions o = options(1);
  o.simulate_stages = {4};
  o.simulate_models = {model_preset("tiny")};  // 2 blocks
  stateflow::testing::expect_error([&] { check_depth_targets(o); },
                                   "--simulate-stages 4: model tiny has only 2 blocks");
  o.simulate_models = {o.model};  // 8 blocks
  EXPECT_NO_THROW(check_depth_targets(o));
  o.stages = 1;  // one stage predicts too: its time is split between blocks and head by FLOPs
  EXPECT_NO_THROW(check_depth_targets(o));
}

// One stage on one device predicts deeper pipelines: at P = 1 the prediction is the measured
// stage itself (blocks and head add back up to it), and deeper ones spread its blocks.
TEST(BenchDepth, OneMeasuredStagePredicts) {
  const uint64_t seed = stateflow::testing::fresh_seed();
  SCOPED_TRACE(seed);
  BenchOptions o = options(seed);
  o.stages = 1, o.microbatches = 1, o.schedules = {"stateflow"}, o.chunk_sweep = {4};
  o.simulate_stages = {1, 2, 4};
  BenchResult r = run_bench(o);
  DepthPredictions d = predict_depths(r, o, o.model);
  ASSERT_EQ(d.rows.size(), 3u);
  const BenchRow& run = r.rows[0];
  double measured = 0;
  for (int c = 0; c < run.chunks(); ++c) measured += run.costs.forward_time[0][c] + run.costs.backward_time[0][c];
  EXPECT_NEAR(d.rows[0].step_s, measured, 1e-9 * measured);
  EXPECT_NEAR(double(d.rows[0].peak_bytes), double(run.peak_bytes()), 0.02 * double(run.peak_bytes()));
  // Deeper: the work is spread, so a step takes less than the one stage's.
  EXPECT_LT(d.rows[2].step_s, d.rows[0].step_s);
  EXPECT_EQ(d.rows[2].stage_peak_bytes.size(), 4u);
}

// A run recorded with --json predicts, read back anywhere (--predict-from), exactly what it
// predicted when it ran; a file that is not such a record is refused naming it.
TEST(BenchDepth, RecordedRunPredictsAsTheRunDid) {
  const uint64_t seed = stateflow::testing::fresh_seed();
  SCOPED_TRACE(seed);
  BenchOptions o = options(seed);
  o.simulate_stages = {4, 8};
  const BenchResult r = run_bench(o);
  const DepthPredictions in_run = predict_depths(r, o, o.model);
  const nlohmann::json record = nlohmann::json::parse(bench_json(r, o).dump(2));
  BenchOptions loaded;
  loaded.simulate_stages = {4, 8};
  const BenchResult back = bench_from_json(record, loaded, "record.json");
  EXPECT_EQ(loaded.model.to_json(), o.model.to_json());
  EXPECT_EQ(loaded.batch, o.batch);
  EXPECT_EQ(loaded.microbatches, o.microbatches);
  ASSERT_EQ(back.rows.size(), r.rows.size());
  const DepthPredictions again = predict_depths(back, loaded, loaded.model);
  ASSERT_EQ(again.rows.size(), in_run.rows.size());
  for (size_t i = 0; i < again.rows.size(); ++i) {
    EXPECT_EQ(again.rows[i].schedule, in_run.rows[i].schedule);
    EXPECT_EQ(again.rows[i].tokens_per_s, in_run.rows[i].tokens_per_s) << i;
    EXPECT_EQ(again.rows[i].stage_peak_bytes, in_run.rows[i].stage_peak_bytes) << i;
  }
  nlohmann::json broken = record;
  broken["results"][0].erase("measured_costs");
  EXPECT_THROW(
      {
        try {
          bench_from_json(broken, loaded, "broken.json");
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("broken.json"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
}

// Predicting a hybrid from a GDN run adds the attention blocks' K/V prefixes from their
// formula: at P = 2, 1f1b's stage 0 (blocks GGGA) holds two microbatches' prefixes and one
// gradient at its peak.
TEST(BenchDepth, HybridPredictionsCountKvPrefixesPerMicrobatchInFlight) {
  const uint64_t seed = stateflow::testing::fresh_seed();
  SCOPED_TRACE(seed);
  BenchOptions o = options(seed);
  o.simulate_stages = {2};
  o.chunk_sweep.clear();
  o.schedules = {"1f1b"};
  BenchResult r = run_bench(o);
  ModelConfig hybrid = o.model;
  hybrid.pattern = "GGGAGGGA";
  hybrid.complete_sections();
  const DepthPredictions gdn = predict_depths(r, o, o.model), d = predict_depths(r, o, hybrid);
  ASSERT_EQ(d.rows.size(), 1u);
  const nlohmann::json& a = hybrid.section("attention");
  const int64_t prefix = o.batch / o.microbatches * o.seq_len * a.at("kv_heads").get<int64_t>() *
                         a.at("head_dim").get<int64_t>() * 2 * int64_t(sizeof(double));
  EXPECT_EQ(gdn.rows[0].peak_kv_prefix_bytes, 0);
  EXPECT_EQ(d.rows[0].peak_kv_prefix_bytes, 3 * prefix);
  std::ostringstream table;
  print_depth_predictions(d, o, table);
  EXPECT_NE(table.str().find("kv_prefix"), std::string::npos) << table.str();
}
