// The trainer: a run stopped and resumed from its checkpoint ends bitwise where an unbroken
// run ends (and, resumed with another stage count and chunking, equal to rounding); a NaN/Inf
// loss stops the step naming it, or is skipped with --skip-nonfinite; SIGINT stops the run
// after the step in progress with a checkpoint that resumes. Also: loss falls on the recall
// task, pipelined runs train like one stage, and --trace writes trace-event JSON.
#include <gtest/gtest.h>

#include <csignal>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <cstring>
#include <limits>
#include <sstream>

#include "temp_dir.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/stop_signal.h"
#include "train/planner.h"
#include "train/trainer.h"

using namespace stateflow;
using namespace stateflow::testing;

namespace {

TrainOptions tiny_options(Rng& rng, DType dtype) {
  TrainOptions o;
  o.model = model_preset("tiny");
  o.model.seed = rng.next_u64();
  o.dtype = dtype;
  o.data.seed = rng.next_u64();
  o.data.recall = RecallConfig{4, 4, 1};
  o.steps = 6, o.batch = 4, o.seq_len = 24;
  o.stages = 2, o.microbatches = 2, o.chunks = 3;
  o.warmup = 2, o.log_every = 1000;
  return o;
}

std::vector<double> losses_of(const std::vector<StepReport>& r) {
  std::vector<double> out;
  for (const StepReport& s : r) out.push_back(s.loss);
  return out;
}

// name -> (value, m, v) of every parameter, copied.
std::map<std::string, std::vector<Tensor>> snapshot(Trainer& t) {
  std::map<std::string, std::vector<Tensor>> out;
  for (Stage* s : t.pipeline().stages()) {
    AdamW& opt = s->optimizer();
    for (size_t i = 0; i < opt.params().size(); ++i)
      out[opt.params()[i]->name] = {opt.params()[i]->value.clone(), opt.exp_avg(i).clone(), opt.exp_avg_sq(i).clone()};
  }
  return out;
}

Param& param_named(Trainer& t, const std::string& name) {
  for (Stage* s : t.pipeline().stages())
    if (Param* p = s->model().find_param(name)) return *p;
  throw Error("no param " + name);
}

// A log that raises SIGINT, as a user pressing Ctrl-C would, once `trigger` has been flushed.
struct InterruptingLog : std::stringbuf {
  std::string trigger;
  int sync() override {
    if (!trigger.empty() && str().find(trigger) != std::string::npos) trigger.clear(), std::raise(SIGINT);
    return 0;
  }
};

}  // namespace

TEST(Trainer, StopAndResumeEndsBitwiseWhereAnUnbrokenRunEnds) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  TempDir dir;
  const TrainOptions o = tiny_options(rng, DType::F32);
  std::ostringstream quiet;
  Trainer unbroken(o);
  const std::vector<double> want = losses_of(unbroken.run(quiet));

  TrainOptions first = o;
  first.save_dir = dir.path.string();
  Trainer a(first);
  std::vector<double> got;
  for (int i = 0; i < 3; ++i) got.push_back(a.step().loss);
  a.save_checkpoint();

  TrainOptions second = o;
  second.resume = dir.path.string();
  Trainer b(second);
  EXPECT_EQ(b.steps_done(), 3);
  for (double l : losses_of(b.run(quiet))) got.push_back(l);
  EXPECT_EQ(got, want);  // bitwise
  const auto end = snapshot(unbroken), resumed = snapshot(b);
  for (const auto& [name, tensors] : end)
    for (int k = 0; k < 3; ++k)
      EXPECT_EQ(std::memcmp(tensors[k].raw(), resumed.at(name)[k].raw(), tensors[k].nbytes()), 0) << name << " " << k;
}

TEST(Trainer, ResumesUnderAnotherStageCountAndChunking) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  TempDir dir;
  TrainOptions o = tiny_options(rng, DType::F64);
  std::ostringstream quiet;
  Trainer unbroken(o);
  const std::vector<double> want = losses_of(unbroken.run(quiet));

  o.save_dir = dir.path.string();
  Trainer a(o);
  std::vector<double> got;
  for (int i = 0; i < 3; ++i) got.push_back(a.step().loss);
  a.save_checkpoint();

  o.resume = dir.path.string();
  o.stages = 1, o.microbatches = 4, o.chunks = 5;  // chunking reassociates sums: equal to rounding
  Trainer b(o);
  for (double l : losses_of(b.run(quiet))) got.push_back(l);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-10 * std::abs(want[i])) << "step " << i;
  const auto end = snapshot(unbroken), resumed = snapshot(b);
  for (const auto& [name, tensors] : end)
    for (int k = 0; k < 3; ++k) EXPECT_LT(max_rel_diff(resumed.at(name)[k], tensors[k]), 1e-10) << name << " " << k;
}

TEST(Trainer, NonFiniteLossStopsTheStepNamingItAndWhere) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  Trainer t(tiny_options(rng, DType::F32));
  t.step();
  Param& p = param_named(t, "blocks.1.mlp.W2");
  p.value.data<float>()[rng.below(p.value.numel())] = std::numeric_limits<float>::quiet_NaN();
  const auto before = snapshot(t);
  // Everything after the poisoned weight is NaN, so the backward pass meets it first in the
  // last stage's last parameter.
  const std::string last = t.pipeline().stages().back()->model().params().back()->name;
  expect_error([&] { t.step(); }, "step 2: the loss is nan and the gradient norm nan; the first non-finite "
                                  "gradient of the backward pass is in " + last + " (stage 1)");
  expect_error([&] { t.step(); }, "pass --skip-nonfinite");
  const auto after = snapshot(t);
  for (const auto& [name, tensors] : before)
    for (int k = 0; k < 3; ++k)
      EXPECT_EQ(std::memcmp(tensors[k].raw(), after.at(name)[k].raw(), tensors[k].nbytes()), 0) << name;
}

TEST(Trainer, SkipNonfiniteSkipsTheUpdateAndCountsIt) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  TempDir dir;
  TrainOptions o = tiny_options(rng, DType::F32);
  o.skip_nonfinite = true, o.save_dir = dir.path.string(), o.steps = 4;
  Trainer t(o);
  t.step();
  Param& p = param_named(t, "blocks.0.mixer.Wq");
  float& w = p.value.data<float>()[rng.below(p.value.numel())];
  const float good = w;
  w = std::numeric_limits<float>::infinity();
  const auto before = snapshot(t);
  StepReport r = t.step();
  EXPECT_TRUE(r.skipped);
  EXPECT_NE(r.warning.find("step 2: the loss is"), std::string::npos) << r.warning;
  EXPECT_EQ(t.skipped_steps(), 1);
  EXPECT_EQ(t.steps_done(), 2);
  EXPECT_EQ(t.pipeline().stages()[0]->optimizer().steps(), 1);
  const auto after = snapshot(t);
  for (const auto& [name, tensors] : before)
    for (int k = 0; k < 3; ++k)
      EXPECT_EQ(std::memcmp(tensors[k].raw(), after.at(name)[k].raw(), tensors[k].nbytes()), 0) << name;
  w = good;
  EXPECT_FALSE(t.step().skipped);
  EXPECT_EQ(t.pipeline().stages()[0]->optimizer().steps(), 2);
  t.save_checkpoint();
  o.resume = dir.path.string();
  Trainer resumed(o);
  EXPECT_EQ(resumed.skipped_steps(), 1);
  EXPECT_EQ(resumed.steps_done(), 3);
  EXPECT_EQ(resumed.pipeline().stages()[1]->optimizer().steps(), 2);
}

TEST(Trainer, SigintStopsAfterTheStepWithACheckpointThatResumes) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  TempDir dir;
  TrainOptions o = tiny_options(rng, DType::F32);
  o.save_dir = dir.path.string(), o.save_every = 100, o.steps = 50, o.log_every = 1;
  Trainer t(o);
  InterruptingLog buf;
  buf.trigger = "step     2/50";
  std::ostream log(&buf);
  install_stop_handlers();
  std::vector<StepReport> r = t.run(log);
  EXPECT_EQ(t.stopped_by(), SIGINT);
  EXPECT_EQ(r.size(), 2u);
  EXPECT_NE(buf.str().find("stopped by SIGINT after step 2 of 50; continue with: stateflow train --resume " +
                           o.save_dir),
            std::string::npos)
      << buf.str();
  EXPECT_EQ(find_checkpoint(o.save_dir), dir / "step-000002");
  o.resume = o.save_dir, o.steps = 3;
  Trainer resumed(o);
  EXPECT_EQ(resumed.steps_done(), 2);
  std::ostringstream quiet;
  install_stop_handlers();  // the process-wide request stays until then
  EXPECT_EQ(resumed.run(quiet).size(), 1u);
  EXPECT_EQ(resumed.stopped_by(), 0);
  EXPECT_EQ(find_checkpoint(o.save_dir), dir / "step-000003");  // saved at the end
}

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
  const TempDir dir;
  o.trace_path = dir / "trace.json";
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

// --chunks auto's online tuning switches the partition (and chunk count) between steps on
// measured times; every partition is exact, so the run's losses and weights are those of a
// run that never switched, to float64 rounding.
TEST(Trainer, ChunkTuningSwitchesBetweenStepsAndStaysExact) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE(cat("seed ", seed));
  Rng rng(seed);
  TrainOptions o = tiny_options(rng, DType::F64);
  o.model = resolve_model_config("tiny", "", "GA|AG");
  o.model.seed = rng.next_u64();
  o.steps = 4, o.seq_len = 48, o.chunk_lengths = {10, 30, 8};  // no alpha of the grid cuts so
  Trainer fixed(o);
  std::ostringstream quiet;
  const std::vector<StepReport> reference = fixed.run(quiet);

  AutoChunks chosen;
  for (const char* kind : {"embedding", "gdn_block", "mlp_block", "attention_block", "lm_head"})
    chosen.costs.kinds[kind] = {{1e-5, 1e-7, 0}, {2e-5, 2e-7, 0}, 64};
  chosen.costs.kinds["attention_block"].forward.per_pair = 1e-8;
  chosen.costs.resident_bytes_per_parameter = 32;
  chosen.space.model = o.model, chosen.space.dtype = o.dtype, chosen.space.stages = 2;
  chosen.space.batch = o.batch, chosen.space.seq_len = o.seq_len, chosen.space.schedules = {"stateflow"};
  chosen.space.microbatches = {o.microbatches}, chosen.space.recompute = {false}, chosen.space.multiple = 1;
  chosen.plan.microbatches = o.microbatches, chosen.plan.chunk_lengths = o.chunk_lengths;
  chosen.plan.chunks = 3;
  Trainer tuned(o);
  tuned.enable_chunk_tuning(chosen, 3, -1.0);  // any other partition is taken
  std::vector<StepReport> steps;
  for (int i = 0; i < 4; ++i) steps.push_back(tuned.step());
  EXPECT_TRUE(steps[0].tuning.empty());  // the warm-up step is not measured
  EXPECT_NE(steps[1].tuning.find("switching to N "), std::string::npos) << steps[1].tuning;
  EXPECT_NE(tuned.pipeline().config().chunk_lengths, o.chunk_lengths);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(steps[size_t(i)].loss, reference[size_t(i)].loss, 1e-10 * reference[size_t(i)].loss);
  const auto a = snapshot(fixed), b = snapshot(tuned);
  for (const auto& [name, tensors] : a) {
    const Tensor& x = tensors[0];
    const Tensor& y = b.at(name)[0];
    double num = 0, den = 0;
    for (int64_t k = 0; k < x.numel(); ++k) {
      num = std::max(num, std::abs(x.data<double>()[k] - y.data<double>()[k]));
      den = std::max(den, std::abs(x.data<double>()[k]));
    }
    EXPECT_LE(num, 1e-10 * den) << name;
  }
}
