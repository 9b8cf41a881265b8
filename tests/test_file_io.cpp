// Atomic file writes: the content lands under the final name with its size and CRC, nothing
// is left beside it, an uncommitted writer leaves no file, and failures name the path.
#include <gtest/gtest.h>

#include "core/crc32.h"
#include "core/file_io.h"
#include "temp_dir.h"
#include "test_util.h"

using namespace stateflow;
using namespace stateflow::testing;
namespace fs = std::filesystem;

TEST(FileIo, AtomicWriteReplacesTheFileAndLeavesNothingBeside) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  TempDir dir;
  const std::string path = dir / "f.bin";
  for (int round = 0; round < 2; ++round) {  // create, then replace
    std::string content(rng.below(100000), '\0');
    for (char& c : content) c = static_cast<char>(rng.below(256));
    FileDigest d = write_file_atomically(path, content);
    EXPECT_EQ(d.bytes, content.size());
    EXPECT_EQ(d.crc32, crc32(content.data(), content.size()));
    std::vector<uint8_t> back = read_file_bytes(path, "test file");
    EXPECT_EQ(std::string(back.begin(), back.end()), content);
  }
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()), 1);
}

TEST(FileIo, UncommittedWriterLeavesNoFile) {
  TempDir dir;
  {
    AtomicFileWriter w(dir / "f.bin");
    w.write("abc", 3);
  }
  EXPECT_TRUE(fs::is_empty(dir.path));
}

TEST(FileIo, FailuresNameThePath) {
  TempDir dir;
  expect_error([&] { write_file_atomically(dir / "missing/f.bin", "x"); }, "missing/.f.bin.tmp");
  expect_error([&] { write_file_atomically(dir / "missing/f.bin", "x"); }, "No such file or directory");
  expect_error([&] { read_file_bytes(dir / "nothing.bin", "data file"); }, "cannot open data file");
}
