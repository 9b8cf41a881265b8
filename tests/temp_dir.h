// A fresh temporary directory for a test, removed with everything in it when the test ends.
// Its name comes from mkdtemp, so no two tests, processes or worktrees on one machine ever
// share it (a fixed name, or one made from a replayed STATEFLOW_TEST_SEED, would let one
// test run remove or overwrite another's files).
#pragma once
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"

namespace stateflow::testing {

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string name = (std::filesystem::temp_directory_path() / "stateflow_test_XXXXXX").string();
    SF_CHECK(::mkdtemp(name.data()) != nullptr, "mkdtemp(", name, "): ", std::strerror(errno));
    path = name;
  }
  ~TempDir() {
    std::error_code ignored;  // a destructor must not throw
    std::filesystem::remove_all(path, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const { return (path / name).string(); }
  // Writes `bytes` to the file `name` in the directory and returns its path.
  std::string write(const std::string& name, const std::vector<uint8_t>& bytes) const {
    const std::string file = *this / name;
    write_bytes(file, bytes);
    return file;
  }
};

}  // namespace stateflow::testing
