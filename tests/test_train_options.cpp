// TrainOptions' JSON form (what a checkpoint records) round-trips every field.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "train/train_options.h"

using namespace stateflow;
using namespace stateflow::testing;

TEST(TrainOptions, JsonRoundTripsEveryField) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  TrainOptions o;
  o.model = model_preset("tiny");
  o.model.seed = rng.next_u64();
  o.dtype = DType::F64;
  o.data = DataConfig{"text", "/data/x.txt", 300, rng.next_u64(), RecallConfig{3, 5, 2}};
  o.steps = 100 + rng.below(100), o.batch = 6, o.seq_len = 40, o.stages = 2, o.microbatches = 3;
  o.chunks = 7, o.chunk_lengths = {10, 30}, o.schedule = "gpipe", o.transport = "mpi", o.timeout_s = 7.5;
  o.lr = rng.uniform(1e-4, 1e-2), o.min_lr = o.lr / 10, o.warmup = 9;
  o.adamw = AdamWConfig{0.8, 0.99, 1e-7, rng.uniform()};
  o.clip = 0.5, o.log_every = 3, o.trace_path = "t.json";
  o.save_dir = "ck", o.save_every = 11, o.keep = 2, o.resume = "ck/step-000011", o.skip_nonfinite = true;
  const nlohmann::json j = o.to_json();
  const TrainOptions back = TrainOptions::from_json(j);
  EXPECT_EQ(back.to_json(), j);
  EXPECT_EQ(back.lr, o.lr);  // exact: doubles survive the text form
  EXPECT_EQ(back.adamw.weight_decay, o.adamw.weight_decay);
  EXPECT_EQ(back.data.seed, o.data.seed);
  EXPECT_EQ(back.model.seed, o.model.seed);
  EXPECT_EQ(back.chunk_lengths, o.chunk_lengths);
  EXPECT_TRUE(back.skip_nonfinite);
  // Fields left out keep their defaults.
  EXPECT_EQ(TrainOptions::from_json({{"steps", 5}}).batch, TrainOptions{}.batch);
}
