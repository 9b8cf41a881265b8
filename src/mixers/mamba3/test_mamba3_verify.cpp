// Models with Mamba-3 blocks through `stateflow verify`: the pipelined, chunked step (chunks
// down to one token, lengths that don't divide the block) gives the unchunked step's loss and
// gradients, alone and mixed with GDN, SISO and MIMO, with and without recomputation.
#include <gtest/gtest.h>

#include <algorithm>

#include "model/mixer.h"
#include "train/verify.h"

using namespace stateflow;

namespace {

VerifyOptions options(const std::string& pattern, int stages, int microbatches) {
  VerifyOptions o;
  o.model.pattern = pattern;
  o.model.complete_sections();
  o.stages = stages, o.microbatches = microbatches;
  return o;
}

}  // namespace

TEST(Mamba3Verify, HybridPipelinedF64WithinOneE10) {
  VerifyOptions o = options("GM|MG", 2, 2);
  o.chunkings = {{1, 2, 3, 39}, {45}, {8, 8, 8, 8, 8, 5}, {20, 1, 24}};
  VerifyResult r = run_verify(o);
  EXPECT_EQ(r.columns.size(), o.chunkings.size());
  EXPECT_LE(r.max_rel_grad_diff, 1e-10);
  EXPECT_TRUE(r.passed());
}

TEST(Mamba3Verify, MimoWithRecomputeF64WithinOneE10) {
  VerifyOptions o = options("MM|M", 2, 2);
  o.model.mixers["mamba3"] = {{"heads", 4}, {"head_dim", 4}, {"state_size", 6}, {"rank", 2}, {"groups", 2},
                              {"rope_fraction", 1.0}, {"block_size", 5}, {"output_norm", true}};
  o.model.complete_sections();
  o.model.validate();
  o.recompute = true;
  VerifyResult r = run_verify(o);  // the built-in chunkings, 1-token chunks among them
  EXPECT_GE(r.columns.size(), 6u);
  EXPECT_LE(r.max_rel_grad_diff, 1e-10);
  EXPECT_TRUE(r.passed());
}

TEST(Mamba3Verify, HybridF32WithinOneE4) {
  VerifyOptions o = options("GM", 1, 1);
  o.dtype = DType::F32;
  VerifyResult r = run_verify(o);
  EXPECT_LE(r.max_rel_grad_diff, 1e-4);
  EXPECT_GT(r.max_rel_grad_diff, 0.0) << "f32 chunking reassociates sums: an exact 0 means nothing was compared";
}

TEST(Mamba3Presets, SizesAndPatterns) {
  const ModelConfig m = model_preset("mamba3-1.3b");
  EXPECT_EQ(m.pattern, std::string(24, 'M'));
  EXPECT_EQ(m.section("mamba3")["heads"], 32);
  EXPECT_EQ(m.section("mamba3")["head_dim"], 64);
  EXPECT_EQ(m.section("mamba3")["state_size"], 128);
  EXPECT_EQ(m.section("mamba3")["groups"], 1);
  EXPECT_NEAR(double(m.num_parameters()) / 1e9, 1.3, 0.1);
  const ModelConfig mix = model_preset("gdn-mamba3-1.3b");
  EXPECT_EQ(mix.blocks().size(), 24u);
  EXPECT_EQ(std::count(mix.pattern.begin(), mix.pattern.end(), 'M'), 12);
  EXPECT_EQ(mix.section("gdn"), model_preset("gdn-1.3b").section("gdn"));
  EXPECT_EQ(mix.section("mamba3"), m.section("mamba3"));
  for (const char* name : {"mamba3-small", "mamba3-1.3b", "gdn-mamba3-1.3b"}) model_preset(name).validate();
}
