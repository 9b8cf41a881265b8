// Model presets: the named sizes are what their names say.
#include <gtest/gtest.h>

#include "mixers/gdn/gdn_config.h"
#include "model/config.h"

using namespace stateflow;

TEST(Config, LargePresetsHaveAboutTheParametersTheirNamesSay) {
  for (auto [name, billions] : {std::pair{"gdn-3b", 3.0}, {"gdn-7b", 7.0}, {"gdn-14b", 14.0}}) {
    const ModelConfig c = model_preset(name);
    const double params = double(c.num_parameters());
    const GdnConfig g = gdn_config(c);
    std::printf("%s: %.3f B parameters (d_model %lld, %lld blocks, %lld heads of %lld, MLP %lld)\n", name, params / 1e9,
                (long long)c.d_model, (long long)c.num_blocks(), (long long)g.heads, (long long)g.head_dk,
                (long long)c.mlp_hidden);
    EXPECT_NEAR(params / 1e9, billions, 0.1 * billions) << name;
    // The gdn-1.3b shape: heads of 128 over the whole width, MLP 2.75 x d_model.
    EXPECT_EQ(g.heads * g.head_dk, c.d_model) << name;
    EXPECT_EQ(g.head_dk, 128);
    EXPECT_EQ(g.head_dv, 128);
    EXPECT_EQ(c.mlp_hidden * 2048, c.d_model * 5632) << name;
    EXPECT_EQ(c.num_blocks() % 8, 0) << name;  // even cuts at P = 4 and P = 8
    EXPECT_NO_THROW(c.validate());
  }
}

TEST(Config, HybridPresetsPutAttentionInEveryFourthBlock) {
  for (auto [name, billions] : {std::pair{"hybrid-1.3b", 1.3}, {"hybrid-3b", 3.0}, {"hybrid-7b", 7.0}}) {
    const ModelConfig c = model_preset(name);
    const double params = double(c.num_parameters());
    std::printf("%s: %.3f B parameters, pattern %s\n", name, params / 1e9, c.pattern.c_str());
    EXPECT_NEAR(params / 1e9, billions, 0.15 * billions) << name;
    const std::string blocks = c.blocks();
    for (size_t i = 0; i < blocks.size(); ++i) EXPECT_EQ(blocks[i], i % 4 == 3 ? 'A' : 'G') << name << " block " << i;
    EXPECT_EQ(c.section("attention").at("head_dim"), 256);
    EXPECT_EQ(c.section("attention").at("kv_heads"), 2);
    EXPECT_NO_THROW(c.validate());
  }
}
