// Golden files: small schedules kept as text under tests/golden/. A test compares its output
// with the file; UPDATE_GOLDEN=1 rewrites the files instead (review the diff before committing).
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace stateflow::testing {

inline std::filesystem::path golden_path(const std::string& name) {
  return std::filesystem::path(__FILE__).parent_path() / "golden" / name;
}

inline void expect_matches_golden(const std::string& name, const std::string& actual) {
  const std::filesystem::path path = golden_path(name);
  const char* update = std::getenv("UPDATE_GOLDEN");
  if (update && std::string(update) == "1") {
    std::ofstream(path) << actual;
    std::cout << "[golden] rewrote " << path << "\n";
    return;
  }
  std::ifstream in(path);
  ASSERT_TRUE(in) << "missing golden file " << path << "; create it with UPDATE_GOLDEN=1";
  std::stringstream expected;
  expected << in.rdbuf();
  EXPECT_EQ(actual, expected.str()) << "output differs from " << path
                                    << "; if the change is intended, rerun with UPDATE_GOLDEN=1 and review the diff";
}

}  // namespace stateflow::testing
