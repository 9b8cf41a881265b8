// `stateflow bench` on the tiny model: both schedules run on the same batches, the stash it
// measures on stage 0 follows the model ((N+P-1)/N of a sequence vs P sequences), a chunk
// sweep gives one row per N and marks the fastest, and a run that runs out of memory becomes
// an OOM row while the others go on; each finished run prints a progress line to stderr.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "pipeline/local_transport.h"
#include "test_util.h"
#include "train/bench.h"
#include "pipeline/chunking.h"

using namespace stateflow;

static BenchOptions tiny_options(uint64_t seed) {
  BenchOptions o;
  o.model = model_preset("tiny");
  o.model.seed = seed, o.data.seed = seed;
  o.dtype = DType::F64;
  o.batch = 2, o.seq_len = 64, o.stages = 2, o.microbatches = 2;
  o.warmup_steps = 0, o.steps = 1;
  return o;
}

TEST(Bench, ComparesSchedulesAndMeasuresTheStashRatio) {
  const uint64_t seed = stateflow::testing::fresh_seed();
  SCOPED_TRACE(seed);
  BenchOptions o = tiny_options(seed);
  o.batch = 4, o.seq_len = 128, o.microbatches = 4;
  o.chunk_lengths = even_chunk_lengths(o.seq_len, 4);
  BenchResult r = run_bench(o);
  ASSERT_EQ(r.rows.size(), 2u);
  EXPECT_EQ(r.rows[0].schedule, "1f1b");
  EXPECT_EQ(r.rows[0].chunks(), 1);
  EXPECT_EQ(r.rows[1].chunks(), 4);
  for (auto& row : r.rows) {
    EXPECT_FALSE(row.oom);
    EXPECT_GT(row.tokens_per_s, 0);
    EXPECT_GE(row.bubble_simulated, 0);
    EXPECT_LT(row.bubble_simulated, 1);
    ASSERT_EQ(row.stage_memory.size(), 2u);
    EXPECT_GT(row.stage_memory[1].peak_of(MemCategory::Weights), 0);
    EXPECT_TRUE(row.gpu_used_bytes.empty());  // a CPU run asks no GPU
    EXPECT_EQ(row.host_issue_s, 0.0);         // the host's work is the step: nothing issued ahead
  }
  // 1f1b holds P = 2 sequences on stage 0, stateflow (4 + 2 - 1) / 4 of one.
  const double ratio = double(r.rows[1].stage_peak_stash[0]) / double(r.rows[0].stage_peak_stash[0]);
  EXPECT_NEAR(ratio, 5.0 / 8.0, 0.1 * 5.0 / 8.0);

  nlohmann::json j = nlohmann::json::parse(bench_json(r, o).dump());
  ASSERT_EQ(j["results"].size(), 2u);
  EXPECT_EQ(j["results"][1]["host_issue_s"].get<double>(), 0.0);
  EXPECT_NEAR(j["results"][1]["stash_stage0_vs_1f1b"].get<double>(), ratio, 1e-12);
  EXPECT_NEAR(j["results"][1]["peak_bytes_vs_1f1b"].get<double>(),
              double(r.rows[1].peak_bytes()) / double(r.rows[0].peak_bytes()), 1e-12);
  EXPECT_NEAR(j["results"][1]["throughput_vs_1f1b"].get<double>(), r.rows[1].tokens_per_s / r.rows[0].tokens_per_s,
              1e-12);
}

TEST(Bench, ChunkSweepGivesOneRowPerNAndMarksTheFastest) {
  const uint64_t seed = stateflow::testing::fresh_seed();
  SCOPED_TRACE(seed);
  BenchOptions o = tiny_options(seed);
  o.chunk_sweep = {2, 4, 8};
  BenchResult r = run_bench(o);
  ASSERT_EQ(r.rows.size(), 4u);
  EXPECT_EQ(r.rows[0].schedule, "1f1b");
  const BenchRow* fastest = nullptr;
  int marked = 0;
  for (size_t i = 1; i < r.rows.size(); ++i) {
    const BenchRow& row = r.rows[i];
    EXPECT_EQ(row.schedule, "stateflow");
    EXPECT_EQ(row.chunk_lengths, even_chunk_lengths(o.seq_len, o.chunk_sweep[i - 1]));
    if (!fastest || row.tokens_per_s > fastest->tokens_per_s) fastest = &row;
    marked += row.best;
  }
  EXPECT_EQ(marked, 1);
  EXPECT_TRUE(fastest->best);
  EXPECT_FALSE(r.rows[0].best);

  std::ostringstream out;
  print_bench(r, o, out);
  const std::string text = out.str();
  std::vector<int> printed;  // N of every table line of stateflow
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    std::string schedule;
    int n = 0;
    if (line.rfind("stateflow", 0) == 0 && fields >> schedule >> n) printed.push_back(n);
  }
  EXPECT_EQ(printed, o.chunk_sweep) << text;
  EXPECT_EQ(text.find("<- best N"), text.rfind("<- best N")) << text;
  EXPECT_NE(text.find("<- best N"), std::string::npos) << text;
}

TEST(Bench, OutOfMemoryBecomesAnOomRowAndTheBenchGoesOn) {
  const uint64_t seed = stateflow::testing::fresh_seed();
  SCOPED_TRACE(seed);
  // Stage 1 of the N = 4 run (a message of 1 sequence x 16 tokens) runs out of memory at its
  // first receive, as a GPU would.
  struct OutOfMemoryTransport : LocalTransport {
    using LocalTransport::LocalTransport;
    Tensor recv(int peer, const MessageTag& tag, const MessageSpec& spec) override {
      if (spec.shape.at(0) == 16) throw OutOfMemoryError("out of GPU memory allocating 9.00 GiB for activations\nsecond line");
      return LocalTransport::recv(peer, tag, spec);
    }
  };
  BenchOptions o = tiny_options(seed);
  o.chunk_sweep = {2, 4, 8};
  int built = 0;
  o.make_pipeline = [&](const PipelineConfig& pc, const std::string&) {
    ++built;
    auto hub = std::make_shared<LocalHub>(2, 5.0);
    std::vector<std::unique_ptr<Transport>> endpoints;
    endpoints.push_back(std::make_unique<LocalTransport>(hub, 0));
    endpoints.push_back(std::make_unique<OutOfMemoryTransport>(std::move(hub), 1));
    return std::make_unique<Pipeline>(pc, std::move(endpoints));
  };
  std::ostringstream progress;  // the runs' progress lines go to stderr as they finish
  std::streambuf* stderr_buf = std::cerr.rdbuf(progress.rdbuf());
  BenchResult r = run_bench(o);
  std::cerr.rdbuf(stderr_buf);
  EXPECT_EQ(built, 2) << "built by the first run and again after the one that ran out of memory";
  ASSERT_EQ(r.rows.size(), 4u);
  const std::string lines = progress.str();
  EXPECT_EQ(std::count(lines.begin(), lines.end(), '\n'), 4) << lines;
  EXPECT_NE(lines.find("bench [1/4] 1f1b N=1: "), std::string::npos) << lines;
  EXPECT_NE(lines.find("bench [3/4] stateflow N=4: OOM ("), std::string::npos) << lines;
  EXPECT_NE(lines.find("out of GPU memory allocating 9.00 GiB for activations\nbench [4/4] stateflow N=8: "),
            std::string::npos)
      << lines;
  EXPECT_NE(lines.find(" tokens/s, "), std::string::npos) << lines;
  EXPECT_TRUE(r.rows[2].oom);
  EXPECT_EQ(r.rows[2].chunks(), 4);
  EXPECT_EQ(r.rows[2].oom_message, "out of GPU memory allocating 9.00 GiB for activations");
  EXPECT_FALSE(r.rows[2].best);
  for (int i : {0, 1, 3}) {
    EXPECT_FALSE(r.rows[i].oom);
    EXPECT_GT(r.rows[i].tokens_per_s, 0);
  }

  std::ostringstream out;
  print_bench(r, o, out);
  EXPECT_NE(out.str().find("OOM  out of GPU memory allocating 9.00 GiB for activations\n"), std::string::npos)
      << out.str();
  nlohmann::json j = bench_json(r, o);
  EXPECT_TRUE(j["results"][2]["oom"].get<bool>());
  EXPECT_EQ(j["results"][2]["oom_message"], r.rows[2].oom_message);
  EXPECT_FALSE(j["results"][2].contains("tokens_per_s"));
  EXPECT_FALSE(j["results"][3]["oom"].get<bool>());
}

// The runs of one bench share a pipeline built once (its model drawn once) and reshaped from run
// to run: each run's loss is bitwise, and its peak memory per stage that of the same run alone
// in a bench of its own, whatever ran before it (other schedules, chunk counts, microbatches,
// recomputation).
TEST(Bench, RunsInOneProcessMeasureWhatEachRunAloneMeasures) {
  const uint64_t seed = stateflow::testing::fresh_seed();
  SCOPED_TRACE(seed);
  BenchOptions o = tiny_options(seed);
  o.batch = 4, o.microbatches = 4, o.steps = 2;
  const std::vector<PlannedRun> runs = {{"1f1b", "1f1b", 4, false, {64}},
                                        {"N = 4", "stateflow", 4, false, even_chunk_lengths(64, 4)},
                                        {"N = 3 uneven, M = 2", "stateflow", 2, false, {5, 40, 19}},
                                        {"N = 2 recomputed", "stateflow", 4, true, {32, 32}},
                                        {"gpipe, M = 2", "gpipe", 2, false, {64}}};
  int built = 0;
  o.make_pipeline = [&](const PipelineConfig& pc, const std::string& transport) {
    ++built;
    return make_pipeline(pc, transport);
  };
  o.planned = runs;
  const BenchResult together = run_bench(o);
  EXPECT_EQ(built, 1);
  ASSERT_EQ(together.rows.size(), runs.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    SCOPED_TRACE(runs[i].label);
    o.planned = {runs[i]};
    const BenchResult alone = run_bench(o);
    ASSERT_EQ(alone.rows.size(), 1u);
    const BenchRow &a = alone.rows[0], &t = together.rows[i];
    EXPECT_EQ(t.chunk_lengths, runs[i].chunk_lengths);
    EXPECT_TRUE(std::isfinite(a.loss) && a.loss > 0) << a.loss;
    EXPECT_EQ(t.loss, a.loss);  // bitwise: the same weights, batches and unit order
    // Weights, grads and optimizer state exactly; what a step holds in flight within a few
    // per cent, as two runs alone differ by when each stage's thread sends and frees.
    auto near = [](int64_t x, int64_t y) { return std::abs(double(x - y)) <= 0.05 * double(std::max(x, y)); };
    ASSERT_EQ(t.stage_memory.size(), a.stage_memory.size());
    for (size_t s = 0; s < a.stage_memory.size(); ++s) {
      SCOPED_TRACE(::testing::Message() << "stage " << s);
      EXPECT_TRUE(near(t.stage_memory[s].total_peak, a.stage_memory[s].total_peak))
          << t.stage_memory[s].total_peak << " vs " << a.stage_memory[s].total_peak;
      EXPECT_TRUE(near(t.stage_peak_stash[s], a.stage_peak_stash[s]))
          << t.stage_peak_stash[s] << " vs " << a.stage_peak_stash[s];
      for (MemCategory c : {MemCategory::Weights, MemCategory::Grads, MemCategory::Optimizer})
        EXPECT_EQ(t.stage_memory[s].peak_of(c), a.stage_memory[s].peak_of(c)) << mem_category_name(c);
      EXPECT_TRUE(near(t.stage_memory[s].peak_of(MemCategory::Activations),
                       a.stage_memory[s].peak_of(MemCategory::Activations)));
    }
  }
  // Every chunking computes the whole-sequence loss (f64: to rounding).
  for (const BenchRow& row : together.rows) EXPECT_NEAR(row.loss, together.rows[0].loss, 1e-12 * row.loss);
  // --rebuild-each-run builds one pipeline per run and measures the same.
  o.planned = runs, o.rebuild_each_run = true, built = 0;
  const BenchResult rebuilt = run_bench(o);
  EXPECT_EQ(built, int(runs.size()));
  for (size_t i = 0; i < runs.size(); ++i) EXPECT_EQ(rebuilt.rows[i].loss, together.rows[i].loss) << runs[i].label;
}

TEST(Bench, WithoutA1f1bRowThereAreNoRatios) {
  const uint64_t seed = stateflow::testing::fresh_seed();
  SCOPED_TRACE(seed);
  BenchOptions o = tiny_options(seed);
  o.schedules = {"stateflow"}, o.chunk_lengths = even_chunk_lengths(o.seq_len, 2);
  BenchResult r = run_bench(o);
  EXPECT_EQ(baseline(r), nullptr);
  EXPECT_FALSE(bench_json(r, o)["results"][0].contains("throughput_vs_1f1b"));
}

// --breakdown: one profiled step after the timed ones times every layer of every stage once
// per unit and pass (recomputed forwards on their own), and the printed table sums them by kind.
TEST(Bench, BreakdownTimesEveryLayerOncePerUnitAndPass) {
  const uint64_t seed = stateflow::testing::fresh_seed();
  SCOPED_TRACE(seed);
  BenchOptions o = tiny_options(seed);
  o.schedules = {"stateflow"};
  o.chunk_lengths = {10, 33, 21};  // uneven
  o.recompute = true;
  o.breakdown = true;
  BenchResult r = run_bench(o);
  ASSERT_EQ(r.rows.size(), 1u);
  const BenchRow& row = r.rows[0];
  EXPECT_EQ(row.units_per_stage, o.microbatches * 3);
  ASSERT_EQ(row.layer_timings.size(), size_t(o.stages));
  int per_pass[3] = {0, 0, 0};
  for (const auto& stage : row.layer_timings)
    for (const LayerTiming& t : stage) {
      EXPECT_EQ(t.calls, row.units_per_stage) << t.kind << " " << pass_name(t.pass);
      EXPECT_GT(t.host_s, 0);
      EXPECT_EQ(t.device_s, t.host_s);  // on the CPU the work is done when the call returns
      EXPECT_EQ(t.host_waits, 0);
      ++per_pass[int(t.pass)];
    }
  const int layers = per_pass[int(Pass::Forward)];
  EXPECT_GE(layers, 4);  // embedding, GDN and MLP blocks, LM head
  EXPECT_EQ(per_pass[int(Pass::Recompute)], layers);
  EXPECT_EQ(per_pass[int(Pass::Backward)], layers);
  std::ostringstream out;
  print_layer_breakdown(r, out);
  EXPECT_NE(out.str().find("gdn_block    forward"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("all          recompute"), std::string::npos) << out.str();
  EXPECT_EQ(bench_json(r, o)["results"][0]["layer_breakdown"].size(), size_t(3 * layers));
}
