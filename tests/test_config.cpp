// Model presets: the named sizes are what their names say.
#include <gtest/gtest.h>

#include "model/config.h"

using namespace stateflow;

TEST(Config, LargePresetsHaveAboutTheParametersTheirNamesSay) {
  for (auto [name, billions] : {std::pair{"gdn-3b", 3.0}, {"gdn-7b", 7.0}, {"gdn-14b", 14.0}}) {
    const ModelConfig c = model_preset(name);
    const double params = double(c.num_parameters());
    std::printf("%s: %.3f B parameters (d_model %lld, %lld layers, %lld heads of %lld, MLP %lld)\n", name, params / 1e9,
                (long long)c.d_model, (long long)c.n_layers, (long long)c.n_heads, (long long)c.head_dk,
                (long long)c.mlp_hidden);
    EXPECT_NEAR(params / 1e9, billions, 0.1 * billions) << name;
    // The gdn-1.3b shape: heads of 128 over the whole width, MLP 2.75 x d_model.
    EXPECT_EQ(c.n_heads * c.head_dk, c.d_model) << name;
    EXPECT_EQ(c.head_dk, 128);
    EXPECT_EQ(c.head_dv, 128);
    EXPECT_EQ(c.mlp_hidden * 2048, c.d_model * 5632) << name;
    EXPECT_EQ(c.n_layers % 8, 0) << name;  // even cuts at P = 4 and P = 8
    EXPECT_NO_THROW(c.validate());
  }
}
