#include "core/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/crc32.h"
#include "core/error.h"

namespace stateflow {

namespace fs = std::filesystem;

std::vector<uint8_t> read_file_bytes(const std::string& path, const std::string& what) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  SF_CHECK(f, "cannot open ", what, " ", path, ": ", std::strerror(errno));
  std::vector<uint8_t> out;
  uint8_t buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.insert(out.end(), buf, buf + n);
  const bool bad = std::ferror(f);
  std::fclose(f);
  SF_CHECK(!bad, "error reading ", what, " ", path, ": ", std::strerror(errno));
  return out;
}

AtomicFileWriter::AtomicFileWriter(std::string path) : path_(std::move(path)) {
  fs::path p(path_);
  std::string tmp_name = ".";  // hidden, beside the target: the rename stays within one file system
  tmp_name += p.filename().string();
  tmp_name += ".tmp";
  tmp_path_ = (p.parent_path() / tmp_name).string();
  f_ = std::fopen(tmp_path_.c_str(), "wb");
  if (!f_) fail_io("create");
}

AtomicFileWriter::~AtomicFileWriter() {
  if (f_) {
    std::fclose(f_);
    std::remove(tmp_path_.c_str());
  }
}

void AtomicFileWriter::fail_io(const char* doing) {
  std::string why = std::strerror(errno);
  if (f_) std::fclose(f_), f_ = nullptr;
  std::remove(tmp_path_.c_str());
  fail("cannot ", doing, " ", tmp_path_, " (for ", path_, "): ", why,
       "; check the directory's permissions and free space, or choose another directory");
}

void AtomicFileWriter::write(const void* data, size_t bytes) {
  SF_CHECK(f_, "write after commit of ", path_);
  if (bytes && std::fwrite(data, 1, bytes, f_) != bytes) fail_io("write");
  digest_.bytes += bytes;
  digest_.crc32 = crc32(data, bytes, digest_.crc32);
}

FileDigest AtomicFileWriter::commit() {
  SF_CHECK(f_, "commit twice of ", path_);
  if (std::fflush(f_) != 0) fail_io("flush");
  if (::fsync(::fileno(f_)) != 0) fail_io("fsync");
  if (std::fclose(f_) != 0) {
    f_ = nullptr;
    fail_io("close");
  }
  f_ = nullptr;
  if (std::rename(tmp_path_.c_str(), path_.c_str()) != 0) fail_io("rename into place");
  fsync_directory(fs::path(path_).parent_path().string());
  return digest_;
}

FileDigest write_file_atomically(const std::string& path, const std::string& contents) {
  AtomicFileWriter w(path);
  w.write(contents.data(), contents.size());
  return w.commit();
}

void fsync_directory(const std::string& dir) {
  const std::string d = dir.empty() ? "." : dir;
  int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY);
  SF_CHECK(fd >= 0, "cannot open directory ", d, " to make its entries durable: ", std::strerror(errno));
  const bool ok = ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  SF_CHECK(ok, "cannot fsync directory ", d, ": ", std::strerror(err));
}

}  // namespace stateflow
