// What `train --resume` does with options given again: each flag has one rule; Applies flags
// override the checkpoint's value (--recompute and --metrics were once dropped), MustMatch
// flags are refused when they differ, saying which and why, ThisRunOnly ones are always the
// command line's; new checkpoints go beside the step directory, also for a bare relative name.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "test_util.h"
#include "train/checkpoint.h"
#include "train/resume_options.h"

using namespace stateflow;
using namespace stateflow::testing;
namespace fs = std::filesystem;

namespace {

TrainOptions saved_options() {
  TrainOptions o;
  o.model = model_preset("tiny");
  o.seq_len = 30, o.chunk_lengths = {10, 20}, o.recompute = false, o.metrics_path = "old.csv";
  o.save_every = 2, o.save_dir = "/somewhere/else", o.device = Device::CPU, o.transport = "mpi", o.timeout_s = 5;
  return o;
}

}  // namespace

TEST(ResumeOptions, EveryFlagHasExactlyOneRule) {
  std::set<std::string> seen;
  for (const ResumeRule& r : resume_rules())
    for (const std::string& f : r.flags) {
      EXPECT_TRUE(seen.insert(f).second) << f << " has two rules";
      EXPECT_EQ(find_resume_rule(f), &r);
      EXPECT_EQ(r.rule == OnResume::MustMatch, !r.why.empty()) << f << ": a MustMatch rule says why, others not";
    }
  EXPECT_EQ(find_resume_rule("--no-such-flag"), nullptr);
  for (const char* f : {"--recompute", "--metrics", "--lr", "--stages", "--chunks", "--save-dir"})
    EXPECT_EQ(find_resume_rule(f)->rule, OnResume::Applies) << f;
  for (const char* f : {"--preset", "--config", "--dtype", "--data", "--data-seed"})
    EXPECT_EQ(find_resume_rule(f)->rule, OnResume::MustMatch) << f;
}

TEST(ResumeOptions, GivenOptionsApplyAndTheRestAreTheCheckpoints) {
  const TrainOptions saved = saved_options();
  TrainOptions given;  // the command line's values, defaults where not given
  given.recompute = true, given.metrics_path = "new.csv", given.lr = 1e-4, given.steps = 900;
  given.transport = "local", given.timeout_s = 60, given.resume = "ck/step-000004";
  const TrainOptions o = resumed_options(saved, given, {"--recompute", "--metrics", "--lr"}, "/runs/a/step-000004");
  EXPECT_TRUE(o.recompute);
  EXPECT_EQ(o.metrics_path, "new.csv");
  EXPECT_EQ(o.lr, 1e-4);
  EXPECT_EQ(o.steps, saved.steps) << "--steps was not given";
  EXPECT_EQ(o.chunk_lengths, saved.chunk_lengths);
  EXPECT_EQ(o.save_every, 2);
  // Where and how this run executes is never the checkpoint's.
  EXPECT_EQ(o.transport, "local");
  EXPECT_EQ(o.timeout_s, 60);
  EXPECT_EQ(o.resume, "ck/step-000004");
  EXPECT_EQ(o.save_dir, "/runs/a") << "saves go beside the step directory resumed from";
}

TEST(ResumeOptions, OptionsThatMustMatchAreRefusedNamingBothValuesAndWhy) {
  const TrainOptions saved = saved_options();
  TrainOptions given = saved;
  given.data.seed = saved.data.seed + 1;
  expect_error([&] { resumed_options(saved, given, {"--data-seed"}, "/r/step-000001"); },
               cat("--data-seed differs from the checkpoint's (checkpoint vs command line: data_seed ", saved.data.seed,
                   " vs ", saved.data.seed + 1, "): the data stream continues"));
  given = saved;
  given.model = model_preset("small");
  expect_error([&] { resumed_options(saved, given, {"--preset"}, "/r/step-000001"); },
               "--preset differs from the checkpoint's (checkpoint vs command line: d_model 24 vs 128");
  given = saved;
  given.dtype = DType::F64;
  expect_error([&] { resumed_options(saved, given, {"--dtype"}, "/r/step-000001"); }, "dtype \"f32\" vs \"f64\"");
  // The same value given again is fine, and so is another name for the same model.
  given = saved;
  given.model.name = "from-a-file";
  EXPECT_NO_THROW(resumed_options(saved, given, {"--config", "--data-seed", "--dtype"}, "/r/step-000001"));
  // A mixer's settings (gdn.keep_sweep: memory for time) may change: the command line's is taken.
  given.model.mixers["gdn"]["keep_sweep"] = true;
  EXPECT_TRUE(resumed_options(saved, given, {"--config"}, "/r/step-000001").model.section("gdn").at("keep_sweep"));
}

TEST(ResumeOptions, ANewSequenceLengthKeepsTheNumberOfChunksUnlessANewChunkingIsGiven) {
  const TrainOptions saved = saved_options();  // chunks 10,20 of 30
  TrainOptions given;
  given.seq_len = 48, given.chunks = 4;
  TrainOptions o = resumed_options(saved, given, {"--seq-len"}, "/r/step-000001");
  EXPECT_EQ(o.resolved_chunk_lengths(), (std::vector<int64_t>{24, 24}));
  o = resumed_options(saved, given, {"--seq-len", "--chunks"}, "/r/step-000001");
  EXPECT_EQ(o.resolved_chunk_lengths(), (std::vector<int64_t>{12, 12, 12, 12}));
}

TEST(ResumeOptions, ABareRelativeStepDirectorySavesIntoTheCurrentDirectory) {
  const std::string cwd = fs::current_path().string();
  EXPECT_EQ(save_dir_of("step-000004"), cwd);
  EXPECT_EQ(save_dir_of("step-000004/"), cwd);
  EXPECT_EQ(save_dir_of("./runs/a/step-000004"), (fs::current_path() / "runs" / "a").string());
  EXPECT_EQ(save_dir_of("/runs/a/step-000004/"), "/runs/a");
  const TrainOptions o = resumed_options(saved_options(), TrainOptions{}, {}, "step-000004");
  EXPECT_EQ(o.save_dir, cwd);
}
