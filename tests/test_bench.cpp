// `stateflow bench` on the tiny model: both schedules run on the same batches, and the
// stash it measures on stage 0 follows the model ((N+P-1)/N of a sequence vs P sequences).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "train/bench.h"
#include "train/chunking.h"

using namespace stateflow;

TEST(Bench, ComparesSchedulesAndMeasuresTheStashRatio) {
  BenchOptions o;
  o.model = model_preset("tiny");
  o.dtype = DType::F64;
  o.batch = 4, o.seq_len = 128, o.stages = 2, o.microbatches = 4;
  o.chunk_lengths = even_chunk_lengths(o.seq_len, 4);
  o.steps = 1;
  BenchResult r = run_bench(o);
  ASSERT_EQ(r.rows.size(), 2u);
  EXPECT_EQ(r.rows[0].schedule, "1f1b");
  EXPECT_EQ(r.rows[0].chunks, 1);
  EXPECT_EQ(r.rows[1].chunks, 4);
  for (auto& row : r.rows) {
    EXPECT_GT(row.tokens_per_s, 0);
    EXPECT_GE(row.bubble_simulated, 0);
    EXPECT_LT(row.bubble_simulated, 1);
    ASSERT_EQ(row.stage_memory.size(), 2u);
    EXPECT_GT(row.stage_memory[1].peak_of(MemCategory::Weights), 0);
  }
  // 1f1b holds P = 2 sequences on stage 0, stateflow (4 + 2 - 1) / 4 of one.
  const double ratio = double(r.rows[1].stage_peak_stash[0]) / double(r.rows[0].stage_peak_stash[0]);
  EXPECT_NEAR(ratio, 5.0 / 8.0, 0.1 * 5.0 / 8.0);

  const std::string path = ::testing::TempDir() + "bench.json";
  write_bench_json(r, o, path);
  nlohmann::json j = nlohmann::json::parse(std::ifstream(path));
  ASSERT_EQ(j["results"].size(), 2u);
  EXPECT_NEAR(j["results"][1]["stash_stage0_vs_1f1b"].get<double>(), ratio, 1e-12);
}
