// The safetensors file format, read and written here without outside code:
//
//   8 bytes    N, the header length, unsigned little endian
//   N bytes    JSON object: for each tensor  "name": {"dtype": "F32", "shape": [2, 3],
//              "data_offsets": [begin, end]}, and optionally "__metadata__": {string: string};
//              may end in spaces (we pad it so that the data starts 8-byte aligned)
//   the rest   the tensors' bytes, little endian, row major; offsets are relative to here
//
// Reading validates everything before any tensor byte is touched: the header length
// against the file size, the JSON, every entry's fields, sizes = numel * dtype size, and
// that the tensors tile the data section exactly (contiguous, non-overlapping, nothing
// left over). Supported dtypes: F32, F64, I32, I64, U8, BF16.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/file_io.h"
#include "core/tensor.h"

namespace stateflow {

enum class StDtype { F32, F64, I32, I64, U8, BF16 };  // safetensors' names for them: "F32", ...
const char* st_dtype_name(StDtype t);
size_t st_dtype_size(StDtype t);
StDtype st_dtype_of(DType t);

struct StTensorInfo {
  std::string name;
  StDtype dtype = StDtype::F32;
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte range in the data section
};

// Files larger than this header are refused (the reference implementation's limit too).
constexpr uint64_t kMaxSafetensorsHeader = 100u << 20;

class SafetensorsFile {
 public:
  // Validates `bytes` (a whole file) and keeps them; `what` names the file in errors.
  static SafetensorsFile parse(std::vector<uint8_t> bytes, std::string what);
  static SafetensorsFile read(const std::string& path);

  const std::string& what() const { return what_; }
  const std::vector<StTensorInfo>& tensors() const { return tensors_; }  // in data order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The metadata value of `key`; throws naming the file when it is missing.
  const std::string& meta(const std::string& key) const;
  const StTensorInfo* find(const std::string& name) const;
  const uint8_t* data(const StTensorInfo& t) const { return bytes_.data() + data_start_ + t.begin; }
  // Copies tensor `name` into `dst`, which must have its shape and dtype (errors say which differs).
  void copy_to(const std::string& name, Tensor& dst) const;

 private:
  std::string what_;
  std::vector<uint8_t> bytes_;
  size_t data_start_ = 0;
  std::vector<StTensorInfo> tensors_;
  std::map<std::string, size_t> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

// A tensor to write: `data` holds numel(shape) * st_dtype_size(dtype) bytes.
struct StTensorRef {
  std::string name;
  StDtype dtype = StDtype::F32;
  Shape shape;
  const void* data = nullptr;
};
StTensorRef st_ref(const std::string& name, const Tensor& t);

// The first 8 + N bytes of the file for these tensors, laid out in the given order.
std::string safetensors_header(const std::vector<StTensorRef>& tensors,
                               const std::map<std::string, std::string>& metadata);
// Writes the file atomically (see file_io.h); returns its size and CRC-32.
FileDigest write_safetensors(const std::string& path, const std::vector<StTensorRef>& tensors,
                             const std::map<std::string, std::string>& metadata);

}  // namespace stateflow
