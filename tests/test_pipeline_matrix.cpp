// bench/pipeline_matrix.sh --dry-run: the commands of issue 7's PP = 2 matrix, without a GPU.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

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

TEST(PipelineMatrix, QuickDryRunIsThreeConfigurations) {
  const auto lines = run_lines("--quick --limit 100");
  EXPECT_EQ(count_with(lines, "timeout 100 /opt/sf bench --device cuda"), 6);
  EXPECT_EQ(count_with(lines, "--chunk-sweep 2,4,8,16,32 "), 2);
  EXPECT_EQ(count_with(lines, "--preset gdn-1.3b"), 6);
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
