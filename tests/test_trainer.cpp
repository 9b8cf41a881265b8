// The training loop: loss falls on the recall task, pipelined runs train like one stage,
// and --trace writes the executed timeline as trace-event JSON.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "train/trainer.h"

using namespace stateflow;

namespace {
TrainOptions tiny_run() {
  TrainOptions o;
  o.model = model_preset("tiny");
  o.batch = 4, o.seq_len = 48, o.steps = 40, o.stages = 2, o.microbatches = 2, o.chunks = 3;
  o.lr = 1e-2, o.warmup = 5, o.log_every = 1000;
  o.data.recall.num_pairs = 4, o.data.recall.num_queries = 8;
  return o;
}
}  // namespace

TEST(Trainer, LossFallsOnTheRecallTask) {
  TrainOptions o = tiny_run();
  std::ostringstream log;
  auto reports = Trainer(o).run(log);
  ASSERT_EQ(reports.size(), size_t(o.steps));
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) first += reports[i].loss / 5, last += reports[o.steps - 1 - i].loss / 5;
  EXPECT_LT(last, first - 0.3) << log.str();
  EXPECT_NE(log.str().find("stage 1 peak"), std::string::npos);
}

TEST(Trainer, PipelinedRunTrainsLikeOneStage) {
  TrainOptions o = tiny_run();
  o.dtype = DType::F64, o.steps = 5;
  std::ostringstream log;
  auto pipelined = Trainer(o).run(log);
  o.stages = 1, o.microbatches = 1, o.chunks = 1;
  auto plain = Trainer(o).run(log);
  for (size_t i = 0; i < plain.size(); ++i)
    EXPECT_NEAR(pipelined[i].loss, plain[i].loss, 1e-10 * std::abs(plain[i].loss)) << "step " << i;
}

TEST(Trainer, TraceIsTraceEventJson) {
  TrainOptions o = tiny_run();
  o.steps = 1;
  o.trace_path = ::testing::TempDir() + "trace.json";
  std::ostringstream log;
  Trainer(o).run(log);
  nlohmann::json j = nlohmann::json::parse(std::ifstream(o.trace_path));
  std::set<int> rows;
  std::map<std::string, int> slices;  // by category
  for (auto& e : j.at("traceEvents"))
    if (e.at("ph") == "X") {
      rows.insert(e.at("tid").get<int>());
      EXPECT_GE(e.at("dur").get<double>(), 0);
      ++slices[e.at("cat").get<std::string>()];
    }
  EXPECT_EQ(rows, (std::set<int>{0, 1})) << "one row per stage";
  const int units = 2 * 3;  // microbatches x chunks
  EXPECT_EQ(slices["forward"], 2 * units) << "every F of every unit on both stages";
  EXPECT_EQ(slices["backward"], 2 * units);
  EXPECT_EQ(slices["send"], 2 * units) << "activations up, gradients down";
  EXPECT_EQ(slices["recv"], 2 * units);
}
