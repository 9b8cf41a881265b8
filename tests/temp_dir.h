// A fresh temporary directory for a test, removed with everything in it when the test ends.
#pragma once
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace stateflow::testing {

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    path = std::filesystem::temp_directory_path() / ("stateflow_test_" + std::to_string(fresh_seed()));
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

}  // namespace stateflow::testing
