#include "train/checkpoint.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <map>

#include "core/crc32.h"
#include "core/safetensors.h"
#include "model/device_ops.h"
#include "model/mixer.h"
#include "pipeline/launch.h"

namespace stateflow {

namespace fs = std::filesystem;
using nlohmann::json;

static constexpr const char* kManifest = "manifest.json";
static constexpr const char* kMomentPrefix = "optim.m.";  // AdamW's m of a param
static constexpr const char* kSquarePrefix = "optim.v.";  // and its v

std::string checkpoint_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%06" PRId64, step);
  return buf;
}

std::string stage_file_name(int stage, int stages) { return cat("stage-", stage, "-of-", stages, ".safetensors"); }

// "step-000100" -> 100; false for any other name.
static bool parse_step_dir_name(const std::string& name, int64_t* step) {
  if (name.size() < 6 || name.compare(0, 5, "step-") != 0) return false;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || v > (INT64_MAX - 9) / 10) return false;
    v = v * 10 + (name[i] - '0');
  }
  *step = v;
  return true;
}

// The step directories under save_dir, ascending by step, with whether each is complete.
struct StepDir {
  int64_t step;
  fs::path path;
  bool complete;
};
static std::vector<StepDir> list_step_dirs(const fs::path& save_dir) {
  std::vector<StepDir> out;
  for (const auto& e : fs::directory_iterator(save_dir)) {
    int64_t step;
    if (e.is_directory() && parse_step_dir_name(e.path().filename().string(), &step))
      out.push_back({step, e.path(), fs::exists(e.path() / kManifest)});
  }
  std::sort(out.begin(), out.end(), [](const StepDir& a, const StepDir& b) { return a.step < b.step; });
  return out;
}

std::string model_differences(const ModelConfig& a, const ModelConfig& b) {
  ModelConfig a_blocks = a, b_blocks = b;
  a_blocks.pattern = a.blocks(), b_blocks.pattern = b.blocks();
  json ja = a_blocks.to_json(), jb = b_blocks.to_json();
  for (json* j : {&ja, &jb})  // a mixer's settings change how it runs, not the model
    for (auto& [k, section] : j->items())
      if (const Mixer* m = find_mixer(k); m && section.is_object())
        for (const std::string& f : m->settings) section.erase(f);
  std::string out;
  for (auto it = ja.begin(); it != ja.end(); ++it) {
    if (it.key() == "name" || jb[it.key()] == *it) continue;
    out += cat(out.empty() ? "" : ", ", it.key(), " ", it->dump(), " vs ", jb[it.key()].dump());
  }
  return out;
}

// ---------------------------------------------------------------- manifest

void write_manifest(const std::string& step_dir, const CheckpointManifest& m) {
  json files = json::array();
  for (const auto& f : m.files) {
    char crc[16];
    std::snprintf(crc, sizeof crc, "%08x", f.digest.crc32);
    files.push_back({{"name", f.name}, {"bytes", f.digest.bytes}, {"crc32", crc}});
  }
  json j = {{"format", kCheckpointFormat},
            {"version", kCheckpointVersion},
            {"step", m.state.step},
            {"skipped_steps", m.state.skipped_steps},
            {"data_position", m.state.data_position},
            {"files", files},
            {"options", m.state.options}};
  write_file_atomically((fs::path(step_dir) / kManifest).string(), j.dump(2) + "\n");
}

CheckpointManifest read_manifest(const std::string& step_dir) {
  const std::string path = (fs::path(step_dir) / kManifest).string();
  SF_CHECK(fs::exists(path), "checkpoint ", step_dir, " has no ", kManifest,
           ": it is incomplete (the run stopped while saving it); resume from an earlier one");
  std::vector<uint8_t> bytes = read_file_bytes(path, "checkpoint manifest");
  json j;
  try {
    j = json::parse(bytes.begin(), bytes.end());
  } catch (const json::exception& e) {
    fail("checkpoint manifest ", path, " is not valid JSON (", e.what(), "): the file is corrupt");
  }
  CheckpointManifest m;
  // Integers are checked before get<>(): a float read as one would be undefined behaviour.
  auto integer = [&](const json& v, const char* field) -> const json& {
    SF_CHECK(v.is_number_integer(), path, ": ", field, " must be an integer, got ", v.type_name());
    return v;
  };
  try {
    SF_CHECK(j.is_object() && j.value("format", "") == kCheckpointFormat, path,
             " is not a stateflow checkpoint manifest");
    const int64_t version = integer(j.at("version"), "version").get<int64_t>();
    SF_CHECK(version == kCheckpointVersion, path, ": checkpoint version ", version,
             " is not supported (this stateflow reads version ", kCheckpointVersion, ")");
    m.state.step = integer(j.at("step"), "step").get<int64_t>();
    m.state.skipped_steps = integer(j.at("skipped_steps"), "skipped_steps").get<int64_t>();
    m.state.data_position = integer(j.at("data_position"), "data_position").get<uint64_t>();
    m.state.options = j.at("options");
    SF_CHECK(m.state.step >= 0 && m.state.skipped_steps >= 0 && m.state.skipped_steps <= m.state.step, path,
             ": step ", m.state.step, " and skipped_steps ", m.state.skipped_steps, " are inconsistent");
    SF_CHECK(m.state.options.is_object() && m.state.options.contains("model") &&
                 m.state.options.contains("dtype") && m.state.options.at("dtype").is_string(),
             path, ": options must be an object with the model config and dtype");
    for (const json& f : j.at("files")) {
      CheckpointManifest::File file{f.at("name").get<std::string>(), {}};
      file.digest.bytes = integer(f.at("bytes"), "bytes").get<uint64_t>();
      const std::string crc = f.at("crc32").get<std::string>();
      size_t used = 0;
      unsigned long v = 0;
      try {
        v = std::stoul(crc, &used, 16);
      } catch (const std::exception&) {
        used = 0;
      }
      SF_CHECK(used == crc.size() && crc.size() == 8, path, ": crc32 '", crc, "' of ", file.name,
               " is not 8 hex digits");
      file.digest.crc32 = static_cast<uint32_t>(v);
      SF_CHECK(file.name == stage_file_name(int(m.files.size()), int(j.at("files").size())), path, ": file '",
               file.name, "' is not the expected ", stage_file_name(int(m.files.size()), int(j.at("files").size())));
      m.files.push_back(file);
    }
    SF_CHECK(!m.files.empty(), path, ": the checkpoint lists no stage files");
  } catch (const json::exception& e) {
    fail("checkpoint manifest ", path, " lacks a field or has one of the wrong type (", e.what(), ")");
  }
  return m;
}

// ---------------------------------------------------------------- saving

// t itself on the host; a host copy of a device tensor (the bytes a file gets).
static Tensor host_copy_of(const Tensor& t) { return t.on_host() ? t : t.to(Device::CPU, MemCategory::Other); }

static FileDigest save_stage(Stage& s, const PipelineConfig& pc, const fs::path& dir, int64_t step) {
  std::vector<Param*> params = s.model().params();
  AdamW& opt = s.optimizer();
  // On a GPU only the fp32 masters and moments are saved: the bf16 GEMM copies are re-cast from
  // the masters on loading. The host copies live until the file is written.
  std::vector<std::pair<std::string, Tensor>> host;
  for (Param* p : params) host.emplace_back(p->name, host_copy_of(p->value));
  for (size_t i = 0; i < params.size(); ++i)
    host.emplace_back(kMomentPrefix + params[i]->name, host_copy_of(opt.exp_avg(i)));
  for (size_t i = 0; i < params.size(); ++i)
    host.emplace_back(kSquarePrefix + params[i]->name, host_copy_of(opt.exp_avg_sq(i)));
  std::vector<StTensorRef> tensors;
  for (const auto& [name, t] : host) tensors.push_back(st_ref(name, t));
  std::map<std::string, std::string> meta = {
      {"format", kCheckpointFormat},
      {"version", std::to_string(kCheckpointVersion)},
      {"step", std::to_string(step)},
      {"stage", std::to_string(s.rank())},
      {"stages", std::to_string(pc.stages)},
      {"layers", cat(s.model().begin(), ",", s.model().end())},
      {"optimizer_steps", std::to_string(opt.steps())},
      {"model", pc.model.to_json().dump()},
      {"dtype", dtype_name(pc.dtype)},
      {"device", device_name(pc.device)}};  // where it was trained; informative, loading ignores it
  return write_safetensors((dir / stage_file_name(s.rank(), pc.stages)).string(), tensors, meta);
}

// Removes all but the newest `keep` complete checkpoints, and incomplete ones older than the
// newest complete one (left by a run that died while saving).
static void prune_checkpoints(const fs::path& save_dir, int keep) {
  const std::vector<StepDir> dirs = list_step_dirs(save_dir);
  std::vector<int64_t> complete;
  for (const StepDir& d : dirs)
    if (d.complete) complete.push_back(d.step);
  if (complete.empty()) return;
  const size_t kept = keep > 0 ? std::min<size_t>(size_t(keep), complete.size()) : complete.size();
  const int64_t oldest_kept = complete[complete.size() - kept];
  bool removed = false;
  for (const StepDir& d : dirs) {
    if (d.step >= (d.complete ? oldest_kept : complete.back())) continue;
    fs::remove(d.path / kManifest);  // first, so that a half-removed directory reads as incomplete
    fs::remove_all(d.path);
    removed = true;
  }
  if (removed) fsync_directory(save_dir.string());
}

std::string save_checkpoint(Pipeline& pipeline, const std::string& save_dir, const CheckpointState& state, int keep) {
  const PipelineConfig& pc = pipeline.config();
  const fs::path dir = fs::path(save_dir) / checkpoint_dir_name(state.step);
  const bool reporting = is_reporting_rank(pipeline);
  if (reporting) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    SF_CHECK(!ec, "cannot create checkpoint directory ", dir.string(), ": ", ec.message(),
             "; check --save-dir and its permissions");
    // Saving this step again: drop the old manifest first, so the directory reads as
    // incomplete until the new one is written.
    if (fs::remove(dir / kManifest, ec)) fsync_directory(dir.string());
    fsync_directory(save_dir);
  }
  pipeline.sum_over_processes(0);  // every process sees the directory from here on
  // The GPU runs asynchronously: the last step's updates must have landed before they are copied.
  if (pc.device != Device::CPU) device_backend(pc.device).synchronize();
  std::vector<FileDigest> digests(pc.stages);
  // Data-parallel replicas hold the same weights and optimizer state: replica 0 writes them.
  if (pipeline.replica() == 0)
    for (Stage* s : pipeline.stages()) digests.at(s->rank()) = save_stage(*s, pc, dir, state.step);
  CheckpointManifest m{state, {}};
  for (int r = 0; r < pc.stages; ++r) {
    FileDigest d;  // each file's digest is known to the process that wrote it; zero elsewhere
    d.bytes = static_cast<uint64_t>(pipeline.sum_over_processes(double(digests[r].bytes)));
    d.crc32 = static_cast<uint32_t>(pipeline.sum_over_processes(double(digests[r].crc32)));
    m.files.push_back({stage_file_name(r, pc.stages), d});
  }
  if (reporting) {
    write_manifest(dir.string(), m);
    prune_checkpoints(save_dir, keep);
  }
  pipeline.sum_over_processes(0);  // the checkpoint is complete for every process
  return dir.string();
}

// ---------------------------------------------------------------- loading

std::string find_checkpoint(const std::string& path) {
  SF_CHECK(fs::is_directory(path), "--resume ", path, ": no such directory; give a --save-dir of an earlier run or ",
           "one of its step-NNNNNN directories");
  fs::path dir(path);
  if (dir.filename().empty()) dir = dir.parent_path();  // "runs/a/step-000400/" names step-000400
  if (fs::exists(dir / kManifest)) return dir.string();
  std::vector<StepDir> dirs = list_step_dirs(dir);
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it)
    if (it->complete) return it->path.string();
  fail("--resume ", path, ": no complete checkpoint there (a step-NNNNNN directory with a ", kManifest, ")",
       dirs.empty() ? "" : "; the step directories there are incomplete");
}

std::string save_dir_of(const std::string& step_dir) {
  fs::path dir = fs::absolute(step_dir).lexically_normal();
  if (dir.filename().empty()) dir = dir.parent_path();  // "step-000400/"
  return dir.parent_path().string();
}

static int64_t meta_int(const SafetensorsFile& f, const std::string& key) {
  const std::string& v = f.meta(key);
  size_t used = 0;
  int64_t out = 0;
  try {
    out = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  SF_CHECK(!v.empty() && used == v.size(), f.what(), ": metadata '", key, "' = '", v, "' is not an integer");
  return out;
}

// One verified stage file and the layer range it holds.
struct StagePart {
  SafetensorsFile file;
  int begin = 0, end = 0;
  int64_t optimizer_steps = 0;
};

static StagePart read_stage_part(const std::string& step_dir, const CheckpointManifest& m, int i) {
  const auto& entry = m.files[i];
  const std::string path = (fs::path(step_dir) / entry.name).string();
  SF_CHECK(fs::exists(path), "checkpoint ", step_dir, " lacks ", entry.name, ", which its manifest lists");
  std::vector<uint8_t> bytes = read_file_bytes(path, "checkpoint file");
  SF_CHECK(bytes.size() == entry.digest.bytes, "checkpoint file ", path, " is ", bytes.size(),
           " bytes but the manifest says ", entry.digest.bytes, ": it was truncated or replaced");
  const uint32_t crc = crc32(bytes.data(), bytes.size());
  SF_CHECK(crc == entry.digest.crc32, "checkpoint file ", path, " fails its CRC-32 check (", crc, " vs ",
           entry.digest.crc32, " in the manifest): the file is corrupt");
  StagePart part{SafetensorsFile::parse(std::move(bytes), path)};
  const SafetensorsFile& f = part.file;
  SF_CHECK(f.meta("format") == kCheckpointFormat, path, " is not a stateflow checkpoint file");
  SF_CHECK(meta_int(f, "step") == m.state.step, path, " is from step ", f.meta("step"), " but the manifest is step ",
           m.state.step, ": the stage files do not belong together");
  SF_CHECK(meta_int(f, "stage") == i && meta_int(f, "stages") == int64_t(m.files.size()), path, " says it is stage ",
           f.meta("stage"), " of ", f.meta("stages"), ", but the manifest lists it as stage ", i, " of ",
           m.files.size(), ": the stage files do not belong together");
  SF_CHECK(json::parse(f.meta("model"), nullptr, false) == m.state.options.at("model") &&
               f.meta("dtype") == m.state.options.at("dtype").get<std::string>(),
           path, " holds another model or dtype than the manifest: the stage files do not belong together");
  const std::string& layers = f.meta("layers");
  SF_CHECK(std::sscanf(layers.c_str(), "%d,%d", &part.begin, &part.end) == 2 && part.begin < part.end, path,
           ": metadata 'layers' = '", layers, "' is not a range 'begin,end'");
  part.optimizer_steps = meta_int(f, "optimizer_steps");
  return part;
}

// Copies tensor `name` of f into dst, through a host buffer when dst is on a device; returns
// the host tensor that holds the loaded values (dst itself, or that buffer).
static Tensor load_tensor(const SafetensorsFile& f, const std::string& name, Tensor& dst) {
  Tensor host = dst.on_host() ? dst : Tensor::zeros(dst.shape(), dst.dtype(), MemCategory::Other);
  f.copy_to(name, host);
  if (!dst.on_host()) dst.copy_from(host);
  return host;
}

// The stage files of a step directory, each checked against the manifest, together tiling
// the model's layers, with every parameter (and its two moments) in exactly one of them.
struct CheckedParts {
  std::vector<StagePart> parts;
  std::map<std::string, size_t> owner;  // parameter name -> its part
};

static CheckedParts read_checked_parts(const std::string& step_dir, const CheckpointManifest& m,
                                       const ModelConfig& saved) {
  CheckedParts out;
  std::vector<StagePart>& parts = out.parts;
  for (int i = 0; i < int(m.files.size()); ++i) parts.push_back(read_stage_part(step_dir, m, i));
  // The parts must tile the model's layers in order, and agree on the optimizer's step count.
  for (size_t i = 0; i < parts.size(); ++i) {
    const int want = i == 0 ? 0 : parts[i - 1].end;
    SF_CHECK(parts[i].begin == want, parts[i].file.what(), " holds layers [", parts[i].begin, ", ", parts[i].end,
             ") but the previous stage ends at layer ", want, ": the stage parts overlap or leave a gap");
    SF_CHECK(parts[i].optimizer_steps == parts[0].optimizer_steps, parts[i].file.what(), " has taken ",
             parts[i].optimizer_steps, " optimizer steps but stage 0 ", parts[0].optimizer_steps,
             ": the stage files do not belong together");
  }
  SF_CHECK(parts.back().end == Model::num_layers_of(saved), "the stage files of ", step_dir, " end at layer ",
           parts.back().end, " but the model has ", Model::num_layers_of(saved), ": a stage part is missing");

  // Each parameter by name: where it is, and that no two parts hold it.
  std::map<std::string, size_t>& owner = out.owner;
  for (size_t i = 0; i < parts.size(); ++i) {
    size_t weights = 0;
    for (const StTensorInfo& t : parts[i].file.tensors()) {
      if (t.name.rfind("optim.", 0) == 0) continue;
      auto [it, fresh] = owner.emplace(t.name, i);
      SF_CHECK(fresh, "parameter ", t.name, " is in both ", parts[it->second].file.what(), " and ",
               parts[i].file.what(), ": the stage parts overlap");
      ++weights;
    }
    SF_CHECK(parts[i].file.tensors().size() == 3 * weights, parts[i].file.what(), " holds ",
             parts[i].file.tensors().size(), " tensors for ", weights,
             " parameters; expected each parameter with its optim.m and optim.v");
  }
  return out;
}

CheckpointState load_checkpoint(Pipeline& pipeline, const std::string& step_dir) {
  const CheckpointManifest m = read_manifest(step_dir);
  const PipelineConfig& pc = pipeline.config();
  const ModelConfig saved = ModelConfig::from_json(m.state.options.at("model"));
  const std::string diff = model_differences(saved, pc.model);
  SF_CHECK(diff.empty(), "checkpoint ", step_dir, " was made with another model (checkpoint vs this run: ", diff,
           "); resume with the checkpoint's model, or start a new run");
  const std::string saved_dtype = m.state.options.at("dtype").get<std::string>();
  SF_CHECK(pc.device == Device::CPU || saved_dtype == dtype_name(DType::F32), "checkpoint ", step_dir, " holds ",
           saved_dtype, " weights, but GPU runs keep f32 master weights: resume it on the CPU (--device cpu)");
  SF_CHECK(saved_dtype == dtype_name(pc.dtype), "checkpoint ", step_dir, " holds ", saved_dtype,
           " weights but this run is ", dtype_name(pc.dtype), ": pass --dtype ", saved_dtype);

  const CheckedParts checked = read_checked_parts(step_dir, m, saved);
  const std::vector<StagePart>& parts = checked.parts;
  const std::map<std::string, size_t>& owner = checked.owner;
  int64_t loaded = 0;
  for (Stage* s : pipeline.stages()) {
    AdamW& opt = s->optimizer();
    for (size_t i = 0; i < opt.params().size(); ++i) {
      Param& p = *opt.params()[i];
      auto it = owner.find(p.name);
      SF_CHECK(it != owner.end(), "checkpoint ", step_dir, " has no parameter ", p.name, " (stage ", s->rank(),
               " of this run needs it)");
      const SafetensorsFile& f = parts[it->second].file;
      load_tensor(f, p.name, p.value);
      // The GEMMs' bf16 copy, from the loaded master, rounded as the GPU's AdamW rounds it.
      if (p.value_bf16.defined()) refresh_bf16_copy(p);
      load_tensor(f, kMomentPrefix + p.name, opt.exp_avg(i));
      load_tensor(f, kSquarePrefix + p.name, opt.exp_avg_sq(i));
      ++loaded;
    }
    opt.set_steps(parts[0].optimizer_steps);
  }
  // Every replica loaded the same parameters: count replica 0's.
  const int64_t total = static_cast<int64_t>(pipeline.sum_over_processes(pipeline.replica() == 0 ? double(loaded) : 0));
  SF_CHECK(total == int64_t(owner.size()), "checkpoint ", step_dir, " holds ", owner.size(),
           " parameters but this model has ", total, ": it has tensors this model does not know");
  return m.state;
}

std::map<std::string, Tensor> read_checkpoint_tensors(const std::string& step_dir) {
  const CheckpointManifest m = read_manifest(step_dir);
  const CheckedParts checked = read_checked_parts(step_dir, m, ModelConfig::from_json(m.state.options.at("model")));
  std::map<std::string, Tensor> out;
  for (const StagePart& part : checked.parts)
    for (const StTensorInfo& t : part.file.tensors()) {
      SF_CHECK(t.dtype == StDtype::F32 || t.dtype == StDtype::F64, part.file.what(), ": tensor ", t.name, " is ",
               st_dtype_name(t.dtype), "; checkpoints hold F32 or F64");
      Tensor host = Tensor::zeros(t.shape, t.dtype == StDtype::F32 ? DType::F32 : DType::F64, MemCategory::Other);
      part.file.copy_to(t.name, host);
      out.emplace(t.name, std::move(host));
    }
  return out;
}

LoadedModel load_model_from_checkpoint(const std::string& path, Device device) {
  const std::string step_dir = find_checkpoint(path);
  const CheckpointManifest m = read_manifest(step_dir);
  const ModelConfig saved = ModelConfig::from_json(m.state.options.at("model"));
  const std::string saved_dtype = m.state.options.at("dtype").get<std::string>();
  const DType dtype = parse_dtype(saved_dtype);
  SF_CHECK(device == Device::CPU || dtype == DType::F32, "checkpoint ", step_dir, " holds ", saved_dtype,
           " weights, but the GPU runs f32 master weights: use it on the CPU (--device cpu)");
  const CheckedParts checked = read_checked_parts(step_dir, m, saved);
  LoadedModel out{step_dir, m.state, std::make_unique<Model>(saved, dtype, 0, Model::num_layers_of(saved), device)};
  const std::vector<Param*> params = out.model->params();
  for (Param* p : params) {
    auto it = checked.owner.find(p->name);
    SF_CHECK(it != checked.owner.end(), "checkpoint ", step_dir, " has no parameter ", p->name);
    load_tensor(checked.parts[it->second].file, p->name, p->value);
    if (p->value_bf16.defined()) refresh_bf16_copy(*p);  // as load_checkpoint
  }
  SF_CHECK(params.size() == checked.owner.size(), "checkpoint ", step_dir, " holds ", checked.owner.size(),
           " parameters but its model has ", params.size(), ": it has tensors this model does not know");
  return out;
}

}  // namespace stateflow
