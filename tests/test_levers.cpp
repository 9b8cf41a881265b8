// STATEFLOW_LEVERS_OFF parsing (kernels/cuda/levers.h is plain C++: its parser is tested here,
// without a GPU).
#include <gtest/gtest.h>

#include <cstdlib>

#include "core/error.h"
#include "kernels/cuda/levers.h"

namespace stateflow {
namespace {

TEST(Levers, NamesAreCollectedBetweenCommas) {
  EXPECT_EQ(parse_levers_off(""), ",");
  EXPECT_EQ(parse_levers_off("conv_tiles"), ",conv_tiles,");
  EXPECT_EQ(parse_levers_off("conv_tiles,gemm_rows,"), ",conv_tiles,gemm_rows,");
  EXPECT_EQ(parse_levers_off(",norm_rows"), ",norm_rows,");
}

TEST(Levers, EveryListedLeverIsAccepted) {
  std::string all, expected = ",";
  for (const char* lever : kLeverNames) all += std::string(lever) + ",", expected += std::string(lever) + ",";
  EXPECT_EQ(parse_levers_off(all), expected);
  EXPECT_EQ(parse_levers_off("reduce_ahead"), ",reduce_ahead,");
}

TEST(Levers, AnUnknownNameIsRefusedNamingTheLevers) {
  try {
    parse_levers_off("conv_tiles,norm_row");
    FAIL() << "a misspelt lever was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'norm_row'"), std::string::npos) << e.what();
    const std::string listed =
        "conv_tiles, norm_rows, gemm_rows, reduce_ahead, embed_ahead, side_stream, conv_group, side_defer, "
        "out_gate_by_core, conv_walk, head_blocks, residual_fused, keep_t, gate_steps";
    EXPECT_NE(std::string(e.what()).find(listed), std::string::npos) << e.what();
  }
}

TEST(Levers, TheVariableNamedInTheErrorIsTheOneRead) {
  try {
    parse_levers_off("norm_row", "STATEFLOW_LEVERS_ON");
    FAIL() << "a misspelt lever was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("STATEFLOW_LEVERS_ON names 'norm_row'"), std::string::npos) << e.what();
  }
}

// An untried lever is a lever (STATEFLOW_LEVERS_ON accepts it) and, with neither variable set, off.
TEST(Levers, UntriedLeversAreLeversAndOffUnlessNamed) {
  if (std::getenv("STATEFLOW_LEVERS_ON") || std::getenv("STATEFLOW_LEVERS_OFF"))
    GTEST_SKIP() << "STATEFLOW_LEVERS_ON/OFF set: the defaults are not what runs";
  for (const char* lever : kUntriedLevers) {
    EXPECT_EQ(parse_levers_off(lever, "STATEFLOW_LEVERS_ON"), "," + std::string(lever) + ",");
    EXPECT_TRUE(lever_untried(lever));
    EXPECT_TRUE(lever_off(lever)) << lever;
  }
  EXPECT_FALSE(lever_untried("conv_tiles"));
  EXPECT_FALSE(lever_off("conv_tiles"));
}

}  // namespace
}  // namespace stateflow
