// Rank detection from fake environments: flags win, then torchrun, Open MPI and Slurm in that
// order; incomplete or malformed sources fail with a message naming the variable; the
// rendezvous address comes from the flag, then MASTER_ADDR:MASTER_PORT, then a default.
#include "pipeline/rank_env.h"

#include <gtest/gtest.h>

#include "core/rng.h"
#include "test_util.h"

using namespace stateflow;
using namespace stateflow::testing;

namespace {

// Every launcher's variables at once, with different values per launcher: whichever one
// is read shows in the result.
Environment all_launchers(int world) {
  return {{"RANK", "1"},           {"WORLD_SIZE", std::to_string(world)},
          {"LOCAL_RANK", "1"},     {"OMPI_COMM_WORLD_RANK", "2"},
          {"OMPI_COMM_WORLD_SIZE", std::to_string(world)}, {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
          {"SLURM_PROCID", "3"},   {"SLURM_NTASKS", std::to_string(world)},
          {"SLURM_LOCALID", "0"}};
}

}  // namespace

TEST(RankEnv, NothingGivenMeansNoRank) {
  EXPECT_FALSE(detect_rank({}, {}).has_value());
  EXPECT_FALSE(detect_rank({}, {{"PATH", "/bin"}, {"MASTER_ADDR", "h"}}).has_value());
}

TEST(RankEnv, SourcesInOrderOfPrecedence) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int world = 4 + int(rng.below(60));
  Environment env = all_launchers(world);

  const int flag_rank = int(rng.below(uint64_t(world)));
  auto r = detect_rank({flag_rank, world, -1}, env);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->rank, flag_rank);
  EXPECT_EQ(r->local_rank, flag_rank) << "the local rank defaults to the rank";
  EXPECT_NE(r->source.find("flags"), std::string::npos) << r->source;

  r = detect_rank({}, env);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->rank, 1);
  EXPECT_EQ(r->world_size, world);
  EXPECT_NE(r->source.find("torchrun"), std::string::npos) << r->source;

  env.erase("RANK"), env.erase("WORLD_SIZE"), env.erase("LOCAL_RANK");
  r = detect_rank({}, env);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->rank, 2);
  EXPECT_EQ(r->local_rank, 2);
  EXPECT_NE(r->source.find("Open MPI"), std::string::npos) << r->source;

  env.erase("OMPI_COMM_WORLD_RANK");
  r = detect_rank({}, env);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->rank, 3);
  EXPECT_EQ(r->local_rank, 0);
  EXPECT_NE(r->source.find("Slurm"), std::string::npos) << r->source;
}

TEST(RankEnv, FlagsGiveLocalRank) {
  auto r = detect_rank({3, 8, 1}, {});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->rank, 3);
  EXPECT_EQ(r->world_size, 8);
  EXPECT_EQ(r->local_rank, 1);
}

TEST(RankEnv, BadValuesNameTheProblem) {
  expect_error([] { detect_rank({}, {{"RANK", "abc"}, {"WORLD_SIZE", "2"}}); }, "RANK is 'abc'");
  expect_error([] { detect_rank({}, {{"RANK", "1x"}, {"WORLD_SIZE", "2"}}); }, "not a non-negative integer");
  expect_error([] { detect_rank({}, {{"RANK", "-1"}, {"WORLD_SIZE", "2"}}); }, "RANK is '-1'");
  expect_error([] { detect_rank({}, {{"RANK", "2"}, {"WORLD_SIZE", "2"}}); }, "not below the world size 2");
  expect_error([] { detect_rank({}, {{"RANK", "0"}, {"WORLD_SIZE", "0"}}); }, "must be at least 1");
  expect_error([] { detect_rank({}, {{"RANK", "0"}}); }, "WORLD_SIZE is not");
  expect_error([] { detect_rank({}, {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", ""}}); }, "SLURM_NTASKS is ''");
  expect_error([] { detect_rank({2, -1, -1}, {}); }, "give --rank and --world-size together");
  expect_error([] { detect_rank({4, 4, -1}, {}); }, "rank 4 from flags");
  // A broken higher-precedence source is an error, not a reason to fall back to the next.
  expect_error([] { detect_rank({}, {{"RANK", "abc"}, {"WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "0"},
                                     {"OMPI_COMM_WORLD_SIZE", "2"}}); },
               "RANK is 'abc'");
}

TEST(RankEnv, MpirunAndRendezvousAddress) {
  EXPECT_TRUE(launched_by_mpirun({{"OMPI_COMM_WORLD_RANK", "0"}}));
  EXPECT_FALSE(launched_by_mpirun({{"RANK", "0"}}));
  EXPECT_EQ(rendezvous_address("h:1", {{"MASTER_ADDR", "m"}, {"MASTER_PORT", "2"}}), "h:1");
  EXPECT_EQ(rendezvous_address("", {{"MASTER_ADDR", "m"}, {"MASTER_PORT", "2"}}), "m:2");
  EXPECT_EQ(rendezvous_address("", {{"MASTER_ADDR", "m"}}), "127.0.0.1:29500");
  EXPECT_EQ(rendezvous_address("", {}), "127.0.0.1:29500");
}

TEST(RankEnv, ProcessEnvironmentIsRead) {
  const Environment env = process_environment();
  EXPECT_TRUE(env.count("PATH")) << "PATH is set in any test run";
}
