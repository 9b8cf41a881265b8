// The process grid: rank <-> (stage, replica), the world checked against --stages x
// --data-parallel, and the placement check that keeps a stage group's gradient all-reduce on
// one host when it fits there.
#include "pipeline/grid.h"

#include <gtest/gtest.h>

#include "test_util.h"

using namespace stateflow;
using namespace stateflow::testing;

namespace {

// `hosts` hosts of `per_host` ranks each, ranks packed in order (block placement).
std::vector<RankPlace> packed(int hosts, int per_host) {
  std::vector<RankPlace> out;
  for (int h = 0; h < hosts; ++h)
    for (int g = 0; g < per_host; ++g) out.push_back({"node" + std::to_string(h), g});
  return out;
}

}  // namespace

TEST(ProcessGrid, ReplicasOfAStageAreNeighbouringRanks) {
  const ProcessGrid g = make_grid(12, 3, 0);
  EXPECT_EQ(g.replicas, 4);
  for (int r = 0; r < g.world(); ++r) {
    EXPECT_EQ(g.rank_of(g.stage_of(r), g.replica_of(r)), r);
    EXPECT_EQ(g.stage_of(r), r / 4) << "rank " << r;
  }
  EXPECT_EQ(make_grid(6, 2, 3).replicas, 3);
  EXPECT_EQ(make_grid(2, 2, 0).replicas, 1);
}

TEST(ProcessGrid, AWorldThatIsNotStagesTimesReplicasIsRefused) {
  expect_error([] { make_grid(6, 4, 0); }, "the launch has 6 rank(s), not a multiple of --stages 4");
  expect_error([] { make_grid(8, 2, 3); }, "--stages 2 x --data-parallel 3 needs 6 ranks but the launch has 8");
  expect_error([] { make_grid(4, 2, -1); }, "--data-parallel must be at least 1");
}

TEST(ProcessGrid, PackedPlacementPasses) {
  check_placement(make_grid(8, 2, 4), packed(2, 4));  // each stage group on one host
  check_placement(make_grid(8, 4, 2), packed(2, 4));  // stages 0,1 on node0, 2,3 on node1
  check_placement(make_grid(8, 1, 8), packed(2, 4));  // 8 replicas cannot fit on a 4-rank host
}

TEST(ProcessGrid, AStageGroupSpreadOverHostsIsRefusedWhenItFitsOnOne) {
  // Round-robin placement (mpirun --map-by node): rank r on host r % 2.
  std::vector<RankPlace> round_robin;
  for (int r = 0; r < 8; ++r) round_robin.push_back({"node" + std::to_string(r % 2), r / 2});
  expect_error([&] { check_placement(make_grid(8, 2, 4), round_robin); },
               "stage 0's 4 replicas (ranks 0..3) are spread over 2 hosts");
  expect_error([&] { check_placement(make_grid(8, 2, 4), round_robin); }, "mpirun --map-by slot");
}

TEST(ProcessGrid, TwoRanksOnOneGpuAreRefused) {
  std::vector<RankPlace> places = packed(1, 4);
  places[3].gpu = 1;
  expect_error([&] { check_placement(make_grid(4, 2, 2), places); }, "ranks 1 and 3 both run on GPU 1 of host node0");
  std::vector<RankPlace> cpu(4, RankPlace{"node0", -1});
  check_placement(make_grid(4, 2, 2), cpu);  // CPU ranks share the host freely
}

TEST(ProcessGrid, TheTableNamesEveryRanksStageReplicaHostAndGpu) {
  const std::string table = describe_grid(make_grid(4, 2, 2), packed(2, 2));
  EXPECT_NE(table.find("2 stage(s) x 2 data-parallel replica(s) = 4 ranks"), std::string::npos) << table;
  EXPECT_NE(table.find("rank 1: stage 0, replica 1, host node0, GPU 1"), std::string::npos) << table;
  EXPECT_NE(table.find("rank 2: stage 1, replica 0, host node1, GPU 0"), std::string::npos) << table;
}
