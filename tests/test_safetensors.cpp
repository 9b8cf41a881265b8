// The safetensors reader and writer: exact bytes of a small file as the format defines them,
// round trips of every dtype, and strict validation: each malformed header is refused with a
// message saying what is wrong, every truncation is caught, and random corruption never
// reads out of bounds (it parses or throws Error).
#include <gtest/gtest.h>

#include <cstring>

#include "core/safetensors.h"
#include "temp_dir.h"
#include "test_util.h"

using namespace stateflow;
using namespace stateflow::testing;

namespace {

// A file from a header text (padded as given) and data bytes.
std::vector<uint8_t> file_of(const std::string& header, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out;
  out.reserve(8 + header.size() + data.size());
  for (int b = 0; b < 8; ++b) out.push_back(static_cast<uint8_t>(uint64_t(header.size()) >> (8 * b)));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

SafetensorsFile parse(const std::vector<uint8_t>& bytes) { return SafetensorsFile::parse(bytes, "test.safetensors"); }

void expect_refused(const std::string& header, size_t data_bytes, const std::string& needle) {
  SCOPED_TRACE(header);
  expect_error([&] { parse(file_of(header, std::vector<uint8_t>(data_bytes))); }, needle);
}

std::vector<uint8_t> valid_file(Rng& rng) {
  std::vector<float> a(6);
  std::vector<int64_t> b(3);
  for (auto& x : a) x = static_cast<float>(rng.normal());
  for (auto& x : b) x = static_cast<int64_t>(rng.next_u64());
  std::vector<StTensorRef> t = {{"a", StDtype::F32, {2, 3}, a.data()}, {"b", StDtype::I64, {3}, b.data()}};
  std::string h = safetensors_header(t, {{"k", "v"}});
  std::vector<uint8_t> out(h.begin(), h.end());
  out.insert(out.end(), reinterpret_cast<uint8_t*>(a.data()), reinterpret_cast<uint8_t*>(a.data() + a.size()));
  out.insert(out.end(), reinterpret_cast<uint8_t*>(b.data()), reinterpret_cast<uint8_t*>(b.data() + b.size()));
  return out;
}

}  // namespace

TEST(Safetensors, WritesTheBytesTheFormatDefines) {
  TempDir dir;
  const float v[2] = {1.0f, -2.0f};
  write_safetensors(dir / "x.safetensors", {{"a", StDtype::F32, {2}, v}}, {{"k", "v"}});
  const std::string json = R"({"__metadata__":{"k":"v"},"a":{"data_offsets":[0,8],"dtype":"F32","shape":[2]}})";
  std::string header = json + std::string((8 - json.size() % 8) % 8, ' ');
  std::vector<uint8_t> want = file_of(header, {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0});
  EXPECT_EQ(read_file_bytes(dir / "x.safetensors", "test file"), want);
}

TEST(Safetensors, ReadsAHeaderWrittenByAnotherTool) {
  // Keys in another order, spaces, no metadata, a scalar, and an empty tensor at the offset
  // of a non-empty one.
  const std::string header =
      R"({ "s": {"shape": [], "dtype": "U8", "data_offsets": [2, 3]},
           "z": {"dtype": "F64", "data_offsets": [2, 2], "shape": [0, 4]},
           "w": {"data_offsets": [0, 2], "shape": [2, 1], "dtype": "U8"} }   )";
  SafetensorsFile f = parse(file_of(header, {7, 8, 9}));
  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.tensors()[0].name, "w");  // in data order
  EXPECT_EQ(f.find("w")->shape, (Shape{2, 1}));
  EXPECT_EQ(f.find("z")->dtype, StDtype::F64);
  EXPECT_EQ(f.find("s")->shape, Shape{});
  EXPECT_EQ(*f.data(*f.find("s")), 9);
  EXPECT_TRUE(f.metadata().empty());
  EXPECT_EQ(f.find("nope"), nullptr);
}

TEST(Safetensors, RoundTripsEveryDtypeAndMetadata) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  TempDir dir;
  Tensor f32 = Tensor::zeros({int64_t(rng.below(5) + 1), 3}, DType::F32);
  Tensor f64 = Tensor::zeros({int64_t(rng.below(7) + 1)}, DType::F64);
  Tensor i32 = Tensor::zeros({2, 2, int64_t(rng.below(3) + 1)}, DType::I32);
  for (int64_t i = 0; i < f32.numel(); ++i) f32.data<float>()[i] = static_cast<float>(rng.normal());
  for (int64_t i = 0; i < f64.numel(); ++i) f64.data<double>()[i] = rng.normal();
  for (int64_t i = 0; i < i32.numel(); ++i) i32.data<int32_t>()[i] = static_cast<int32_t>(rng.next_u64());
  std::vector<uint8_t> u8(rng.below(11));
  for (auto& x : u8) x = static_cast<uint8_t>(rng.below(256));
  const int64_t i64 = static_cast<int64_t>(rng.next_u64());
  std::map<std::string, std::string> meta = {{"step", std::to_string(rng.below(1000))}, {"json", R"({"a": [1]})"}};
  const std::string path = dir / "t.safetensors";
  FileDigest d = write_safetensors(path,
                                   {st_ref("blocks.0.mixer.Wq", f32), st_ref("f64", f64), st_ref("i32", i32),
                                    {"u8", StDtype::U8, {int64_t(u8.size())}, u8.data()},
                                    {"i64", StDtype::I64, {}, &i64}},
                                   meta);
  SafetensorsFile f = SafetensorsFile::read(path);
  EXPECT_EQ(d.bytes, std::filesystem::file_size(path));
  EXPECT_EQ(f.metadata(), meta);
  std::vector<uint8_t> raw = read_file_bytes(path, "test file");
  uint64_t header_len = 0;
  for (int b = 7; b >= 0; --b) header_len = (header_len << 8) | raw[b];
  EXPECT_EQ((8 + header_len) % 8, 0u) << "the data must start 8-byte aligned";
  for (const Tensor* t : {&f32, &f64, &i32}) {
    Tensor back = Tensor::zeros(t->shape(), t->dtype());
    f.copy_to(t == &f32 ? "blocks.0.mixer.Wq" : t == &f64 ? "f64" : "i32", back);
    EXPECT_EQ(std::memcmp(back.raw(), t->raw(), t->nbytes()), 0);
  }
  EXPECT_EQ(std::vector<uint8_t>(f.data(*f.find("u8")), f.data(*f.find("u8")) + u8.size()), u8);
  int64_t i64_back;
  std::memcpy(&i64_back, f.data(*f.find("i64")), 8);
  EXPECT_EQ(i64_back, i64);
  EXPECT_EQ(f.meta("step"), meta["step"]);
  expect_error([&] { f.meta("absent"); }, "__metadata__ has no 'absent'");
}

TEST(Safetensors, CopyToNamesTheMismatch) {
  TempDir dir;
  Tensor t = Tensor::zeros({2, 3}, DType::F32);
  write_safetensors(dir / "t.safetensors", {st_ref("w", t)}, {});
  SafetensorsFile f = SafetensorsFile::read(dir / "t.safetensors");
  Tensor wrong_shape = Tensor::zeros({3, 2}, DType::F32), wrong_dtype = Tensor::zeros({2, 3}, DType::F64);
  expect_error([&] { f.copy_to("w", wrong_shape); }, "tensor 'w' has shape [2, 3] but [3, 2] is expected");
  expect_error([&] { f.copy_to("w", wrong_dtype); }, "tensor 'w' is F32 but F64 is expected");
  expect_error([&] { f.copy_to("v", t); }, "has no tensor 'v'");
  expect_error([&] { safetensors_header({st_ref("w", t), st_ref("w", t)}, {}); }, "'w' is written twice");
}

TEST(Safetensors, RefusesMalformedHeadersSayingWhy) {
  const std::string ok = R"("data_offsets":[0,8],"dtype":"F32","shape":[2])";
  expect_error([] { parse({1, 0, 0}); }, "too short");
  expect_error([] { parse({200, 0, 0, 0, 0, 0, 0, 0, '{', '}'}); }, "header length 200 runs past the end");
  expect_refused("[1, 2]", 0, "does not start with '{'");
  expect_refused("{\"a\": ", 0, "not valid JSON");
  expect_refused(R"({"__metadata__": [1]})", 0, "__metadata__ must be an object");
  expect_refused(R"({"__metadata__": {"k": 1}})", 0, "value of 'k' is not a string");
  expect_refused(R"({"a": 3})", 0, "tensor 'a': entry must be an object");
  expect_refused(R"({"": {)" + ok + "}}", 8, "empty name");
  expect_refused(R"({"a": {)" + ok + R"(,"extra":1}})", 8, "unknown field 'extra'");
  expect_refused(R"({"a": {"shape":[2],"data_offsets":[0,8]}})", 8, "dtype is missing");
  expect_refused(R"({"a": {"dtype":"F16","shape":[2],"data_offsets":[0,4]}})", 4, "dtype 'F16' is not supported");
  expect_refused(R"({"a": {"dtype":"F32","data_offsets":[0,8]}})", 8, "shape is missing");
  expect_refused(R"({"a": {"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8, "non-negative integers");
  expect_refused(R"({"a": {"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8, "non-negative integers");
  expect_refused(R"({"a": {"dtype":"U8","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}})", 8,
                 "too large to address");
  expect_refused(R"({"a": {"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8, "data_offsets must be an array");
  expect_refused(R"({"a": {"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})", 8, "non-negative integers");
  expect_refused(R"({"a": {"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8, "end before they begin");
  expect_refused(R"({"a": {"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8, "hold 8 bytes but F32 [3] needs 12");
  expect_refused(R"({"a": {)" + ok + R"(}, "b": {"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12, "overlap");
  expect_refused(R"({"a": {)" + ok + R"(}, "b": {"dtype":"F32","shape":[2],"data_offsets":[12,20]}})", 20, "gap");
  expect_refused(R"({"a": {)" + ok + "}}", 12, "longer than its header says");
  expect_refused(R"({"a": {)" + ok + "}}", 5, "truncated");
  expect_refused(R"({"b": {"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12, "starts at byte 4");
}

TEST(Safetensors, RefusesAHeaderAboveTheLimit) {
  std::vector<uint8_t> big(8 + kMaxSafetensorsHeader + 8, ' ');
  const uint64_t n = kMaxSafetensorsHeader + 1;
  for (int b = 0; b < 8; ++b) big[b] = static_cast<uint8_t>(n >> (8 * b));
  expect_error([&] { parse(big); }, "exceeds the");
}

TEST(Safetensors, EveryTruncationIsCaught) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  std::vector<uint8_t> file = valid_file(rng);
  EXPECT_NO_THROW(parse(file));
  for (size_t n = 0; n < file.size(); ++n)
    EXPECT_THROW(parse(std::vector<uint8_t>(file.begin(), file.begin() + n)), Error) << "prefix of " << n << " bytes";
}

TEST(Safetensors, RandomCorruptionParsesOrThrowsError) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const std::vector<uint8_t> file = valid_file(rng);
  int refused = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<uint8_t> bad = file;
    for (int k = 0, flips = 1 + int(rng.below(4)); k < flips; ++k)
      bad[rng.below(bad.size())] = static_cast<uint8_t>(rng.below(256));
    try {
      SafetensorsFile f = parse(bad);
      uint64_t sum = 0;  // touch every byte each tensor claims: out-of-bounds reads show under ASan
      for (const StTensorInfo& t : f.tensors())
        for (uint64_t i = 0; i < t.end - t.begin; ++i) sum += f.data(t)[i];
      (void)sum;
    } catch (const Error&) {
      ++refused;
    }
  }
  EXPECT_GT(refused, 0);
}
