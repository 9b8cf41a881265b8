#include "core/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

namespace stateflow {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little endian; this host's tensors would need byte swaps");

using nlohmann::json;

const char* st_dtype_name(StDtype t) {
  switch (t) {
    case StDtype::F32: return "F32";
    case StDtype::F64: return "F64";
    case StDtype::I32: return "I32";
    case StDtype::I64: return "I64";
    case StDtype::U8: return "U8";
    case StDtype::BF16: return "BF16";
  }
  return "?";
}

size_t st_dtype_size(StDtype t) {
  switch (t) {
    case StDtype::F32: return 4;
    case StDtype::F64: return 8;
    case StDtype::I32: return 4;
    case StDtype::I64: return 8;
    case StDtype::U8: return 1;
    case StDtype::BF16: return 2;
  }
  return 0;
}

StDtype st_dtype_of(DType t) {
  switch (t) {
    case DType::F32: return StDtype::F32;
    case DType::F64: return StDtype::F64;
    case DType::I32: return StDtype::I32;
    case DType::BF16: break;  // checkpoints hold fp32 master weights, never bf16 copies
  }
  fail("no safetensors dtype for ", dtype_name(t));
}

static StDtype parse_st_dtype(const std::string& s, const std::string& where) {
  for (StDtype t : {StDtype::F32, StDtype::F64, StDtype::I32, StDtype::I64, StDtype::U8, StDtype::BF16})
    if (s == st_dtype_name(t)) return t;
  fail(where, ": dtype '", s, "' is not supported; supported: F32, F64, I32, I64, U8, BF16");
}

// ---------------------------------------------------------------- reading

// One tensor entry of the header, every field checked; `where` prefixes errors.
static StTensorInfo parse_entry(const std::string& name, const json& e, const std::string& where) {
  SF_CHECK(!name.empty(), where, ": a tensor has an empty name");
  SF_CHECK(e.is_object(), where, ": entry must be an object with dtype, shape and data_offsets");
  for (auto it = e.begin(); it != e.end(); ++it)
    SF_CHECK(it.key() == "dtype" || it.key() == "shape" || it.key() == "data_offsets", where, ": unknown field '",
             it.key(), "'");
  SF_CHECK(e.contains("dtype") && e["dtype"].is_string(), where, ": dtype is missing or not a string");
  SF_CHECK(e.contains("shape") && e["shape"].is_array(), where, ": shape is missing or not an array");
  SF_CHECK(e.contains("data_offsets") && e["data_offsets"].is_array() && e["data_offsets"].size() == 2, where,
           ": data_offsets must be an array [begin, end]");
  StTensorInfo t;
  t.name = name;
  t.dtype = parse_st_dtype(e["dtype"].get<std::string>(), where);
  // numel * dtype size, with every product checked for overflow.
  uint64_t bytes = st_dtype_size(t.dtype);
  const uint64_t kMaxDim = uint64_t(1) << 62;
  for (const json& d : e["shape"]) {
    SF_CHECK(d.is_number_unsigned() && d.get<uint64_t>() <= kMaxDim, where, ": shape ", e["shape"].dump(),
             " must hold non-negative integers");
    const uint64_t v = d.get<uint64_t>();
    SF_CHECK(v == 0 || bytes <= std::numeric_limits<uint64_t>::max() / v, where, ": shape ", e["shape"].dump(),
             " is too large to address");
    bytes *= v;
    t.shape.push_back(static_cast<int64_t>(v));
  }
  const json& off = e["data_offsets"];
  SF_CHECK(off[0].is_number_unsigned() && off[1].is_number_unsigned(), where,
           ": data_offsets must be non-negative integers, got ", off.dump());
  t.begin = off[0].get<uint64_t>(), t.end = off[1].get<uint64_t>();
  SF_CHECK(t.begin <= t.end, where, ": data_offsets [", t.begin, ", ", t.end, "] end before they begin");
  SF_CHECK(t.end - t.begin == bytes, where, ": data_offsets [", t.begin, ", ", t.end, "] hold ", t.end - t.begin,
           " bytes but ", st_dtype_name(t.dtype), " ", shape_str(t.shape), " needs ", bytes);
  return t;
}

SafetensorsFile SafetensorsFile::parse(std::vector<uint8_t> bytes, std::string what) {
  SafetensorsFile f;
  f.what_ = std::move(what);
  f.bytes_ = std::move(bytes);
  const std::string& w = f.what_;
  const uint64_t size = f.bytes_.size();
  SF_CHECK(size >= 8, w, " is ", size, " bytes: too short for a safetensors file (it is empty or truncated)");
  uint64_t n = 0;
  for (int b = 7; b >= 0; --b) n = (n << 8) | f.bytes_[b];
  SF_CHECK(n <= size - 8, w, ": the header length ", n, " runs past the end of the file (", size,
           " bytes): the file is truncated or not safetensors");
  SF_CHECK(n <= kMaxSafetensorsHeader, w, ": the header length ", n, " exceeds the ", kMaxSafetensorsHeader,
           "-byte limit: not a safetensors file");
  SF_CHECK(n >= 2 && f.bytes_[8] == '{', w, ": the header does not start with '{': not a safetensors file");
  f.data_start_ = 8 + n;
  const uint64_t data_size = size - f.data_start_;

  json header;  // an object: it starts with '{'
  try {
    header = json::parse(f.bytes_.begin() + 8, f.bytes_.begin() + static_cast<std::ptrdiff_t>(f.data_start_));
  } catch (const json::exception& e) {
    fail(w, ": the header is not valid JSON (", e.what(), "): the file is corrupt");
  }
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      SF_CHECK(it->is_object(), w, ": __metadata__ must be an object of strings");
      for (auto m = it->begin(); m != it->end(); ++m) {
        SF_CHECK(m->is_string(), w, ": __metadata__ value of '", m.key(), "' is not a string");
        f.metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    f.tensors_.push_back(parse_entry(it.key(), *it, cat(w, ": tensor '", it.key(), "'")));
  }
  // The tensors must tile [0, data_size): sorted by range (an empty one before a non-empty
  // one at the same offset), each starts where the last ended.
  std::stable_sort(f.tensors_.begin(), f.tensors_.end(), [](const StTensorInfo& a, const StTensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t at = 0;
  for (const StTensorInfo& t : f.tensors_) {
    SF_CHECK(t.begin == at, w, ": tensor '", t.name, "' starts at byte ", t.begin, " of the data but the previous ",
             "one ends at ", at, t.begin < at ? ": they overlap" : ": there is a gap", " (the file is corrupt)");
    at = t.end;
  }
  SF_CHECK(at == data_size, w, ": the tensors end at byte ", at, " of the data, but the file holds ", data_size,
           " data bytes: the file is ", at > data_size ? "truncated" : "longer than its header says");
  for (size_t i = 0; i < f.tensors_.size(); ++i) f.index_[f.tensors_[i].name] = i;
  return f;
}

SafetensorsFile SafetensorsFile::read(const std::string& path) {
  return parse(read_file_bytes(path, "safetensors file"), path);
}

const std::string& SafetensorsFile::meta(const std::string& key) const {
  auto it = metadata_.find(key);
  SF_CHECK(it != metadata_.end(), what_, ": __metadata__ has no '", key, "'");
  return it->second;
}

const StTensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

void SafetensorsFile::copy_to(const std::string& name, Tensor& dst) const {
  const StTensorInfo* t = find(name);
  SF_CHECK(t, what_, " has no tensor '", name, "'");
  SF_CHECK(t->dtype == st_dtype_of(dst.dtype()), what_, ": tensor '", name, "' is ", st_dtype_name(t->dtype),
           " but ", st_dtype_name(st_dtype_of(dst.dtype())), " is expected");
  SF_CHECK(t->shape == dst.shape(), what_, ": tensor '", name, "' has shape ", shape_str(t->shape), " but ",
           shape_str(dst.shape()), " is expected");
  std::memcpy(dst.raw(), data(*t), t->end - t->begin);
}

// ---------------------------------------------------------------- writing

StTensorRef st_ref(const std::string& name, const Tensor& t) {
  return {name, st_dtype_of(t.dtype()), t.shape(), t.raw()};
}

static uint64_t ref_bytes(const StTensorRef& t) {
  return static_cast<uint64_t>(shape_numel(t.shape)) * st_dtype_size(t.dtype);
}

std::string safetensors_header(const std::vector<StTensorRef>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  json h = json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t at = 0;
  for (const StTensorRef& t : tensors) {
    SF_CHECK(!t.name.empty() && t.name != "__metadata__", "safetensors: bad tensor name '", t.name, "'");
    SF_CHECK(!h.contains(t.name), "safetensors: tensor '", t.name, "' is written twice");
    h[t.name] = {{"dtype", st_dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {at, at + ref_bytes(t)}}};
    at += ref_bytes(t);
  }
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  std::string out(8, '\0');
  for (int b = 0; b < 8; ++b) out[b] = static_cast<char>((uint64_t(text.size()) >> (8 * b)) & 0xFF);
  return out + text;
}

FileDigest write_safetensors(const std::string& path, const std::vector<StTensorRef>& tensors,
                             const std::map<std::string, std::string>& metadata) {
  const std::string header = safetensors_header(tensors, metadata);
  AtomicFileWriter w(path);
  w.write(header.data(), header.size());
  for (const StTensorRef& t : tensors) w.write(t.data, ref_bytes(t));
  return w.commit();
}

}  // namespace stateflow
