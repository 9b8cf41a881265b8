// Checkpoints: what one stage split saves, any other split loads, by parameter name
// (weights, AdamW m and v, step counts, the trainer's state); the newest K are kept and
// incomplete ones are skipped; and every kind of damage (truncation, corruption, a bad
// header, wrong shapes or dtypes, parts that do not belong together, another model) is
// refused with a message saying what is wrong.
#include <gtest/gtest.h>

#include <cstring>

#include "core/crc32.h"
#include "core/safetensors.h"
#include "pipeline/pipeline.h"
#include "temp_dir.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/train_options.h"

using namespace stateflow;
using namespace stateflow::testing;
namespace fs = std::filesystem;

namespace {

PipelineConfig tiny_config(int stages, DType dtype = DType::F32) {
  PipelineConfig pc;
  pc.model = model_preset("tiny");
  pc.model.pattern = "GGG";
  pc.dtype = dtype;
  pc.stages = stages;
  pc.chunk_lengths = {8};
  return pc;
}

void fill_random(Tensor& t, Rng& rng) {
  dispatch_float(t.dtype(), [&](auto z) {
    using T = decltype(z);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<T>()[i] = static_cast<T>(rng.normal());
  });
}

// Random weights, optimizer state and step count, so that a load that misses anything shows.
void scramble(Pipeline& p, Rng& rng) {
  const int64_t steps = static_cast<int64_t>(rng.below(1000));
  for (Stage* s : p.stages()) {
    AdamW& opt = s->optimizer();
    for (size_t i = 0; i < opt.params().size(); ++i) {
      fill_random(opt.params()[i]->value, rng);
      fill_random(opt.exp_avg(i), rng);
      fill_random(opt.exp_avg_sq(i), rng);
    }
    opt.set_steps(steps);
  }
}

CheckpointState random_state(const PipelineConfig& pc, Rng& rng) {
  TrainOptions o;
  o.model = pc.model, o.dtype = pc.dtype, o.stages = pc.stages;
  CheckpointState s{static_cast<int64_t>(rng.below(500) + 1), 0, rng.next_u64(), o.to_json()};
  s.skipped_steps = static_cast<int64_t>(rng.below(uint64_t(s.step)));
  return s;
}

// name -> (value, m, v) of every parameter of the pipeline.
std::map<std::string, std::vector<Tensor>> all_state(Pipeline& p) {
  std::map<std::string, std::vector<Tensor>> out;
  for (Stage* s : p.stages()) {
    AdamW& opt = s->optimizer();
    for (size_t i = 0; i < opt.params().size(); ++i)
      out[opt.params()[i]->name] = {opt.params()[i]->value, opt.exp_avg(i), opt.exp_avg_sq(i)};
  }
  return out;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// A stage file as editable parts, for crafting damaged checkpoints.
struct EditableTensor {
  std::string name;
  StDtype dtype;
  Shape shape;
  std::vector<uint8_t> bytes;
};
struct EditableFile {
  std::vector<EditableTensor> tensors;
  std::map<std::string, std::string> meta;
};

EditableFile load_editable(const std::string& path) {
  SafetensorsFile f = SafetensorsFile::read(path);
  EditableFile e{{}, f.metadata()};
  for (const StTensorInfo& t : f.tensors())
    e.tensors.push_back({t.name, t.dtype, t.shape, std::vector<uint8_t>(f.data(t), f.data(t) + (t.end - t.begin))});
  return e;
}

// Writes the file and updates the manifest's size and CRC of it, so that only the change
// under test is wrong.
void save_editable(const std::string& step_dir, int stage, const EditableFile& e) {
  CheckpointManifest m = read_manifest(step_dir);
  std::vector<StTensorRef> refs;
  for (const auto& t : e.tensors) refs.push_back({t.name, t.dtype, t.shape, t.bytes.data()});
  m.files.at(stage).digest = write_safetensors((fs::path(step_dir) / m.files[stage].name).string(), refs, e.meta);
  write_manifest(step_dir, m);
}

void write_raw_and_refresh_manifest(const std::string& step_dir, int stage, const std::vector<uint8_t>& bytes) {
  CheckpointManifest m = read_manifest(step_dir);
  const std::string path = (fs::path(step_dir) / m.files.at(stage).name).string();
  write_bytes(path, bytes);
  m.files[stage].digest = {bytes.size(), crc32(bytes.data(), bytes.size())};
  write_manifest(step_dir, m);
}

// A saved checkpoint of a P-stage tiny model, and a pipeline to load it into.
struct Saved {
  TempDir dir;
  std::string step_dir;
  CheckpointState state;
};
std::unique_ptr<Saved> save_tiny(int stages, Rng& rng, DType dtype = DType::F32) {
  auto s = std::make_unique<Saved>();
  PipelineConfig pc = tiny_config(stages, dtype);
  auto p = make_local_pipeline(pc);
  scramble(*p, rng);
  s->state = random_state(pc, rng);
  s->step_dir = save_checkpoint(*p, s->dir.path.string(), s->state, 0);
  return s;
}

void expect_load_error(const std::string& step_dir, const std::string& needle, int stages = 2,
                       DType dtype = DType::F32) {
  auto p = make_local_pipeline(tiny_config(stages, dtype));
  expect_error([&] { load_checkpoint(*p, step_dir); }, needle);
}

}  // namespace

TEST(Checkpoint, AnyStageSplitLoadsWhatAnotherSaved) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (int saved_stages : {1, 3}) {
    TempDir dir;
    auto src = make_local_pipeline(tiny_config(saved_stages));
    scramble(*src, rng);
    CheckpointState state = random_state(src->config(), rng);
    const std::string step_dir = save_checkpoint(*src, dir.path.string(), state, 0);
    EXPECT_EQ(fs::path(step_dir).filename().string(), checkpoint_dir_name(state.step));
    EXPECT_TRUE(fs::exists(fs::path(step_dir) / stage_file_name(saved_stages - 1, saved_stages)));
    EXPECT_EQ(SafetensorsFile::read((fs::path(step_dir) / stage_file_name(0, saved_stages)).string()).meta("device"),
              "cpu");
    const auto want = all_state(*src);
    for (int stages : {1, 2, 3}) {
      SCOPED_TRACE(::testing::Message() << "saved with " << saved_stages << " stages, loaded with " << stages);
      auto dst = make_local_pipeline(tiny_config(stages));
      scramble(*dst, rng);
      CheckpointState got = load_checkpoint(*dst, find_checkpoint(dir.path.string()));
      EXPECT_EQ(got.step, state.step);
      EXPECT_EQ(got.skipped_steps, state.skipped_steps);
      EXPECT_EQ(got.data_position, state.data_position);
      EXPECT_EQ(got.options, state.options);
      const auto have = all_state(*dst);
      ASSERT_EQ(have.size(), want.size());
      for (const auto& [name, tensors] : want)
        for (int k = 0; k < 3; ++k) EXPECT_TRUE(bitwise_equal(have.at(name)[k], tensors[k])) << name << " part " << k;
      for (Stage* s : dst->stages()) EXPECT_EQ(s->optimizer().steps(), src->stages()[0]->optimizer().steps());
    }
  }
}

TEST(Checkpoint, KeepsTheNewestKAndSkipsIncompleteOnes) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  TempDir dir;
  auto p = make_local_pipeline(tiny_config(2));
  CheckpointState state = random_state(p->config(), rng);
  fs::create_directories(dir.path / checkpoint_dir_name(2));   // died while saving step 2
  fs::create_directories(dir.path / checkpoint_dir_name(99));  // a newer one still being written
  fs::create_directories(dir.path / "notes");                  // not ours: left alone
  for (int64_t step : {1, 3, 4, 5}) {
    state.step = step, state.skipped_steps = 0;
    save_checkpoint(*p, dir.path.string(), state, 2);
  }
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir.path)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"notes", "step-000004", "step-000005", "step-000099"}));
  EXPECT_EQ(find_checkpoint(dir.path.string()), (dir.path / "step-000005").string());
  EXPECT_EQ(find_checkpoint(dir / "step-000004"), dir / "step-000004");
  EXPECT_EQ(find_checkpoint(dir / "step-000004/"), dir / "step-000004");
  expect_error([&] { find_checkpoint(dir / "step-000099"); }, "no complete checkpoint");
  expect_error([&] { find_checkpoint(dir / "absent"); }, "no such directory");
  expect_error([&] { load_checkpoint(*p, dir / "step-000099"); }, "has no manifest.json: it is incomplete");
  state.step = 6;
  save_checkpoint(*p, dir.path.string(), state, 0);  // keep 0: nothing removed
  EXPECT_TRUE(fs::exists(dir.path / "step-000004"));
}

TEST(Checkpoint, SavingAStepAgainReplacesIt) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  TempDir dir;
  auto p = make_local_pipeline(tiny_config(2));
  CheckpointState state = random_state(p->config(), rng);
  scramble(*p, rng);
  save_checkpoint(*p, dir.path.string(), state, 0);
  scramble(*p, rng);
  const std::string step_dir = save_checkpoint(*p, dir.path.string(), state, 0);
  auto q = make_local_pipeline(tiny_config(1));
  load_checkpoint(*q, step_dir);
  const auto want = all_state(*p), have = all_state(*q);
  for (const auto& [name, tensors] : want) EXPECT_TRUE(bitwise_equal(have.at(name)[0], tensors[0])) << name;
}

TEST(Checkpoint, TruncatedOrCorruptFilesAreDetected) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  {
    auto s = save_tiny(2, rng);
    const std::string path = (fs::path(s->step_dir) / stage_file_name(1, 2)).string();
    std::vector<uint8_t> bytes = read_file_bytes(path, "test");
    bytes.resize(bytes.size() - 1 - rng.below(bytes.size() / 2));
    write_bytes(path, bytes);
    expect_load_error(s->step_dir, "was truncated or replaced");
    // Even with the manifest made to agree, the format check catches the cut.
    write_raw_and_refresh_manifest(s->step_dir, 1, bytes);
    expect_load_error(s->step_dir, "truncated");
  }
  {
    auto s = save_tiny(2, rng);
    const std::string path = (fs::path(s->step_dir) / stage_file_name(0, 2)).string();
    std::vector<uint8_t> bytes = read_file_bytes(path, "test");
    bytes[rng.below(bytes.size())] ^= static_cast<uint8_t>(1u << rng.below(8));
    write_bytes(path, bytes);
    expect_load_error(s->step_dir, "fails its CRC-32 check");
  }
  {
    auto s = save_tiny(2, rng);
    write_raw_and_refresh_manifest(s->step_dir, 0, {8, 0, 0, 0, 0, 0, 0, 0, '{', '"', 'a', '"', ':', ' ', ' ', ' '});
    expect_load_error(s->step_dir, "the header is not valid JSON");
    write_raw_and_refresh_manifest(s->step_dir, 0, {255, 255, 0, 0, 0, 0, 0, 0, '{', '}'});
    expect_load_error(s->step_dir, "runs past the end of the file");
    fs::remove(fs::path(s->step_dir) / stage_file_name(0, 2));
    expect_load_error(s->step_dir, "lacks stage-0-of-2.safetensors");
  }
}

TEST(Checkpoint, CorruptManifestIsDetected) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  auto s = save_tiny(1, rng);
  const std::string manifest = (fs::path(s->step_dir) / "manifest.json").string();
  std::vector<uint8_t> good = read_file_bytes(manifest, "test");
  write_bytes(manifest, std::vector<uint8_t>(good.begin(), good.begin() + good.size() / 2));
  expect_load_error(s->step_dir, "manifest.json is not valid JSON");
  nlohmann::json j = nlohmann::json::parse(good.begin(), good.end());
  j.erase("data_position");
  write_file_atomically(manifest, j.dump());
  expect_load_error(s->step_dir, "lacks a field or has one of the wrong type");
  j = nlohmann::json::parse(good.begin(), good.end());
  j["files"][0]["crc32"] = "xyz";
  write_file_atomically(manifest, j.dump());
  expect_load_error(s->step_dir, "crc32 'xyz' of stage-0-of-1.safetensors is not 8 hex digits");
  j = nlohmann::json::parse(good.begin(), good.end());
  j["version"] = 7;
  write_file_atomically(manifest, j.dump());
  expect_load_error(s->step_dir, "checkpoint version 7 is not supported");
}

TEST(Checkpoint, WrongShapesAndDtypesAreRefused) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  {
    auto s = save_tiny(2, rng);
    EditableFile e = load_editable((fs::path(s->step_dir) / stage_file_name(1, 2)).string());
    EditableTensor& t = e.tensors.at(rng.below(e.tensors.size()));
    t.shape = t.shape.size() == 1 ? Shape{1, t.shape[0]} : Shape{shape_numel(t.shape)};  // same bytes
    save_editable(s->step_dir, 1, e);
    expect_load_error(s->step_dir, "'" + t.name + "' has shape " + shape_str(t.shape));
  }
  {
    auto s = save_tiny(2, rng);
    EditableFile e = load_editable((fs::path(s->step_dir) / stage_file_name(0, 2)).string());
    EditableTensor& t = e.tensors.at(rng.below(e.tensors.size()));
    t.dtype = StDtype::I32;  // same size as F32
    save_editable(s->step_dir, 0, e);
    expect_load_error(s->step_dir, "'" + t.name + "' is I32 but F32 is expected");
  }
  {
    auto s = save_tiny(2, rng, DType::F64);
    expect_load_error(s->step_dir, "holds f64 weights but this run is f32: pass --dtype f64");
    auto p = make_local_pipeline(tiny_config(3, DType::F64));
    EXPECT_NO_THROW(load_checkpoint(*p, s->step_dir));
  }
}

TEST(Checkpoint, PartsThatDoNotBelongTogetherAreRefused) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  auto a = save_tiny(2, rng), b = save_tiny(2, rng);
  const std::string a1 = (fs::path(a->step_dir) / stage_file_name(1, 2)).string();
  const std::string b1 = (fs::path(b->step_dir) / stage_file_name(1, 2)).string();
  {  // stage 1 of another checkpoint (another step), with a manifest that agrees on its bytes
    if (a->state.step == b->state.step) ++b->state.step;
    write_raw_and_refresh_manifest(a->step_dir, 1, read_file_bytes(b1, "test"));
    EditableFile e = load_editable(a1);
    e.meta["step"] = std::to_string(b->state.step);
    save_editable(a->step_dir, 1, e);
    expect_load_error(a->step_dir, "but the manifest is step " + std::to_string(a->state.step));
  }
  auto c = save_tiny(2, rng);
  const std::string c0 = (fs::path(c->step_dir) / stage_file_name(0, 2)).string();
  const std::string c1 = (fs::path(c->step_dir) / stage_file_name(1, 2)).string();
  EditableFile e0 = load_editable(c0), e1 = load_editable(c1);
  {  // stage 1 claims stage 0's number
    EditableFile e = e1;
    e.meta["stage"] = "0";
    save_editable(c->step_dir, 1, e);
    expect_load_error(c->step_dir, "says it is stage 0 of 2, but the manifest lists it as stage 1 of 2");
  }
  {  // layer ranges that leave a gap
    EditableFile e = e1;
    int begin, end;
    std::sscanf(e.meta["layers"].c_str(), "%d,%d", &begin, &end);
    e.meta["layers"] = cat(begin + 1, ",", end);
    save_editable(c->step_dir, 1, e);
    expect_load_error(c->step_dir, "the stage parts overlap or leave a gap");
  }
  {  // a parameter in both parts
    EditableFile e = e1;
    e.tensors.push_back(e0.tensors.front());
    for (const auto& t : e0.tensors)
      if (t.name == "optim.m." + e0.tensors.front().name || t.name == "optim.v." + e0.tensors.front().name)
        e.tensors.push_back(t);
    save_editable(c->step_dir, 1, e);
    expect_load_error(c->step_dir, "parameter " + e0.tensors.front().name + " is in both");
  }
  {  // a tensor the model does not know, with and without its optimizer state
    EditableFile e = e1;
    e.tensors.push_back({"blocks.9.mixer.Wq", StDtype::F32, {1}, {0, 0, 0, 0}});
    save_editable(c->step_dir, 1, e);
    expect_load_error(c->step_dir, "expected each parameter with its optim.m and optim.v");
    e.tensors.push_back({"optim.m.blocks.9.mixer.Wq", StDtype::F32, {1}, {0, 0, 0, 0}});
    e.tensors.push_back({"optim.v.blocks.9.mixer.Wq", StDtype::F32, {1}, {0, 0, 0, 0}});
    save_editable(c->step_dir, 1, e);
    expect_load_error(c->step_dir, "it has tensors this model does not know");
  }
  {  // a parameter missing
    EditableFile e = e1;
    const std::string gone = e.tensors.front().name;
    std::erase_if(e.tensors, [&](const EditableTensor& t) { return t.name.ends_with(gone); });
    save_editable(c->step_dir, 1, e);
    expect_load_error(c->step_dir, "has no parameter " + gone);
  }
  {  // optimizer step counts that disagree
    EditableFile e = e1;
    e.meta["optimizer_steps"] = std::to_string(std::stoll(e.meta["optimizer_steps"]) + 1);
    save_editable(c->step_dir, 1, e);
    expect_load_error(c->step_dir, "optimizer steps but stage 0");
  }
}

TEST(Checkpoint, AnotherModelIsRefusedNamingTheFields) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  auto s = save_tiny(1, rng);
  PipelineConfig pc = tiny_config(1);
  pc.model.d_model = 32, pc.model.mlp_hidden = 40;
  pc.model.name = "renamed";  // the name alone would not matter
  auto p = make_local_pipeline(pc);
  expect_error([&] { load_checkpoint(*p, s->step_dir); },
               "another model (checkpoint vs this run: d_model 24 vs 32, mlp_hidden 48 vs 40)");
  pc = tiny_config(1);
  pc.model.name = "renamed";
  pc.model.pattern = "GGG";
  p = make_local_pipeline(pc);
  EXPECT_NO_THROW(load_checkpoint(*p, s->step_dir));
}
