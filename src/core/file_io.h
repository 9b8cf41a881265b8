// Whole-file reads and crash-safe writes. A file written through AtomicFileWriter is either
// absent or complete on disk: the bytes go to a temporary file in the same directory, which
// is flushed, fsync'ed and renamed over the target, and then the directory is fsync'ed so
// that the rename itself survives a power loss.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace stateflow {

struct FileDigest {
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
};

// The file's bytes; `what` names it in errors ("checkpoint file", ...).
std::vector<uint8_t> read_file_bytes(const std::string& path, const std::string& what);

class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path);
  ~AtomicFileWriter();  // removes the temporary file unless commit() ran
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  void write(const void* data, size_t bytes);
  // Makes the file durable under its final name; returns its size and CRC-32.
  FileDigest commit();

 private:
  [[noreturn]] void fail_io(const char* doing);
  std::string path_, tmp_path_;
  std::FILE* f_ = nullptr;
  FileDigest digest_;
};

FileDigest write_file_atomically(const std::string& path, const std::string& contents);
// fsync of a directory: makes the creation, renaming or removal of its entries durable.
void fsync_directory(const std::string& dir);

}  // namespace stateflow
