// bench/pipeline_matrix.sh: the commands of issue 7's PP = 2 matrix (--dry-run), and the rows
// it appends, with a stand-in for the binary that writes what `stateflow bench --json` writes.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "temp_dir.h"

static const std::string script = std::string(STATEFLOW_SOURCE_DIR) + "/bench/pipeline_matrix.sh";

static std::vector<std::string> run_lines(const std::string& args) {
  const std::string command = "bash " + script + " --dry-run --bin /opt/sf " + args + " 2>&1";
  std::vector<std::string> lines;
  FILE* p = popen(command.c_str(), "r");
  if (!p) return lines;
  std::array<char, 4096> buf;
  std::string text;
  while (fgets(buf.data(), int(buf.size()), p)) text += buf.data();
  EXPECT_EQ(pclose(p), 0) << command << "\n" << text;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

static int count_with(const std::vector<std::string>& lines, const std::string& needle) {
  int n = 0;
  for (auto& l : lines) n += l.find(needle) != std::string::npos;
  return n;
}

TEST(PipelineMatrix, DryRunPrintsOneBenchPerConfigurationAndItsRecomputeRetry) {
  const auto lines = run_lines("--models gdn-1.3b,gdn-3b");
  // 2 models x 3 T x 3 batches, each with its --recompute full retry.
  ASSERT_EQ(count_with(lines, "timeout 300 /opt/sf bench --device cuda"), 36);
  EXPECT_EQ(count_with(lines, "--recompute none"), 18);
  EXPECT_EQ(count_with(lines, "--recompute full"), 18);
  EXPECT_EQ(count_with(lines, "--stages 2 --transport nccl --schedules 1f1b,stateflow"), 36);
  for (const char* T : {"--seq-len 32768 ", "--seq-len 131072 ", "--seq-len 262144 "})
    EXPECT_EQ(count_with(lines, T), 12) << T;
  for (const char* B : {"--batch 1 --microbatches 1 ", "--batch 2 --microbatches 2 ", "--batch 8 --microbatches 8 "})
    EXPECT_EQ(count_with(lines, B), 12) << B;
  // The whole sweep at two configurations (with their retries), per-T lists elsewhere.
  EXPECT_EQ(count_with(lines, "--chunk-sweep 2,4,8,16,32 "), 4);
  EXPECT_EQ(count_with(lines, "--preset gdn-1.3b --seq-len 32768 --batch 1 --microbatches 1 --stages 2 --transport "
                              "nccl --schedules 1f1b,stateflow --chunk-sweep 2,4,8,16,32 "),
            2);
  EXPECT_EQ(count_with(lines, "--simulate-stages 4,8 --simulate-model gdn-1.3b,gdn-3b,gdn-7b"), 18);
  EXPECT_EQ(count_with(lines, "NCCL_"), 0);
}

TEST(PipelineMatrix, QuickDryRunIsFiveConfigurations) {
  const auto lines = run_lines("--quick --limit 100");
  EXPECT_EQ(count_with(lines, "timeout 100 /opt/sf bench --device cuda"), 10);
  EXPECT_EQ(count_with(lines, "--chunk-sweep 2,4,8,16,32 "), 2);
  EXPECT_EQ(count_with(lines, "--preset gdn-1.3b"), 10);
  EXPECT_EQ(count_with(lines, "--seq-len 65536 --batch 2 "), 2);
  EXPECT_EQ(count_with(lines, "--seq-len 131072 --batch 1 "), 2);
}

TEST(PipelineMatrix, TheScriptSetsNoNcclVariable) {
  std::ifstream f(script);
  ASSERT_TRUE(f.good()) << script;
  int line_no = 0;
  for (std::string line; std::getline(f, line);) {
    ++line_no;
    if (line.find_first_not_of(' ') != std::string::npos && line[line.find_first_not_of(' ')] == '#') continue;
    EXPECT_EQ(line.find("NCCL_"), std::string::npos) << "line " << line_no << ": " << line;
  }
}

TEST(PipelineMatrix, AppendsARowPerResultAndRetriesOutOfMemoryWithRecomputation) {
  namespace fs = std::filesystem;
  // A directory of its own: every worktree's test run on this machine runs this test too.
  const stateflow::testing::TempDir tmp;
  const fs::path& dir = tmp.path;
  // Stateflow runs out of memory without recomputation and fits with it.
  const fs::path fake = dir / "stateflow";
  std::ofstream(fake) << R"(#!/usr/bin/env bash
json="" recompute=""
while (($#)); do case $1 in --json) json=$2; shift ;; --recompute) recompute=$2; shift ;; esac; shift; done
if [[ $recompute == none ]]; then
  sf='{"schedule": "stateflow", "chunks": 8, "oom": true, "oom_message": "out of GPU memory allocating 9.00 GiB"}'
else
  sf='{"schedule": "stateflow", "chunks": 8, "oom": false, "best": true, "tokens_per_s": 1700.4,
       "bubble_measured": 0.1, "bubble_simulated": 0.09, "peak_bytes": [{"total": 1073741824}, {"total": 536870912}],
       "gpu_used_bytes": [2147483648, 1610612736], "throughput_vs_1f1b": 1.7004, "peak_bytes_vs_1f1b": 0.5}'
fi
cat >"$json" <<EOF
{"results": [{"schedule": "1f1b", "chunks": 1, "oom": false, "best": false, "tokens_per_s": 1000,
              "bubble_measured": 0.5, "bubble_simulated": 0.45,
              "peak_bytes": [{"total": 2147483648}, {"total": 1073741824}], "gpu_used_bytes": [3221225472, 2147483648],
              "throughput_vs_1f1b": 1.0, "peak_bytes_vs_1f1b": 1.0}, $sf],
 "predictions": [{"model": {"name": "gdn-7b"}, "rows": [{"stages": 8, "schedule": "stateflow", "chunks": 8,
   "tokens_per_s": 5000, "bubble": 0.2, "peak_bytes_max": 161061273600, "oom": true, "best": false}]}]}
EOF
)";
  fs::permissions(fake, fs::perms::owner_all);
  const std::string out = (dir / "matrix.md").string();
  const std::string command = "bash " + script + " --quick --bin " + fake.string() + " --out " + out + " --logs " +
                              (dir / "logs").string() + " >" + (dir / "stderr.txt").string() + " 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  std::ifstream f(out);
  std::vector<std::string> lines;
  for (std::string line; std::getline(f, line);) lines.push_back(line);
  // 5 configurations x (without and with recomputation) x (1f1b, stateflow).
  EXPECT_EQ(count_with(lines, "| gdn-1.3b | "), 20);
  EXPECT_EQ(count_with(lines, "| gdn-1.3b | 32768 | 1 | none | stateflow | 8 | OOM | | | | | | | out of GPU memory "
                              "allocating 9.00 GiB |"),
            1);
  EXPECT_EQ(count_with(lines, "| gdn-1.3b | 131072 | 2 | full | stateflow | 8 | 1700 | 1.700 | 0.100 | 0.090 | "
                              "1.00 / 0.50 | 0.500 | 2.00 / 1.50 | best N |"),
            1);
  EXPECT_EQ(count_with(lines, "| gdn-1.3b | 32768 | 2 | none | 1f1b | 1 | 1000 | 1.000 | 0.500 | 0.450 | 2.00 / 1.00 "
                              "| 1.000 | 3.00 / 2.00 |  |"),
            1);
  // The predictions of all ten runs, under their own heading.
  EXPECT_EQ(count_with(lines, "Predictions of the simulator (not measured)"), 1);
  EXPECT_EQ(count_with(lines, "| gdn-7b | 8 | "), 10);
  EXPECT_EQ(count_with(lines, "| 150.00 | OOM |"), 10);
  EXPECT_EQ(count_with(lines, "### Run of "), 1);
}
