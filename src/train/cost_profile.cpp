#include "train/cost_profile.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <thread>

#include "core/crc32.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/device_ops.h"
#include "model/mixer.h"
#include "model/model.h"
#include "model/optimizer.h"
#include "pipeline/stage_executor.h"
#include "pipeline/units.h"
#include "train/device_memory.h"

namespace stateflow {

namespace {

// Chunk lengths from fractions of the sequence, cuts rounded to the multiple (chunks that
// round away are dropped).
std::vector<int64_t> from_fractions(int64_t T, int64_t multiple, const std::vector<double>& fractions) {
  double total = 0;
  for (double f : fractions) total += f;
  std::vector<int64_t> lengths;
  int64_t prev = 0;
  double sum = 0;
  for (size_t k = 0; k + 1 < fractions.size(); ++k) {
    sum += fractions[k];
    const int64_t cut = std::min<int64_t>(T, std::llround(double(T) * sum / total / double(multiple)) * multiple);
    if (cut > prev && cut < T) lengths.push_back(cut - prev), prev = cut;
  }
  lengths.push_back(T - prev);
  return lengths;
}

std::string device_description(Device d) {
  if (d != Device::CPU) return device_name(d) + std::string(" ") + gpu_name();
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, model = "unknown CPU";
  while (std::getline(cpuinfo, line))
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  return "cpu " + model + " x" + std::to_string(std::thread::hardware_concurrency());
}

// The binary that measures: a rebuilt stateflow may run at other speeds.
std::string build_id() {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return "unknown";
  const auto size = fs::file_size(exe, ec);
  const auto time = fs::last_write_time(exe, ec).time_since_epoch().count();
  return exe.filename().string() + ":" + std::to_string(size) + ":" + std::to_string(time);
}

nlohmann::json profile_key(const ProfileOptions& o) {
  // Levers switched off change the layers' times and stashes (keep_t: the GDN core's kept T).
  const char* levers_off = std::getenv("STATEFLOW_LEVERS_OFF");
  nlohmann::json key = {{"model", o.model.to_json()},  {"dtype", dtype_name(o.dtype)}, {"device", device_description(o.device)},
                        {"batch", o.batch},            {"seq_len", o.seq_len},        {"multiple", o.multiple},
                        {"build", build_id()},         {"levers_off", levers_off ? levers_off : ""}};
  if (o.sm_parts > 1) key["sm_parts"] = o.sm_parts;  // absent for the whole device
  return key;
}

nlohmann::json work_json(const WorkTerms& w) {
  return {{"fixed_bytes", w.fixed}, {"per_token_bytes", w.per_token}, {"per_prefix_token_bytes", w.per_prefix}};
}

WorkTerms work_from_json(const nlohmann::json& j) {
  return {j.at("fixed_bytes").get<double>(), j.at("per_token_bytes").get<double>(),
          j.at("per_prefix_token_bytes").get<double>()};
}

nlohmann::json terms_json(const CostTerms& t) {
  return {{"fixed_s", t.fixed}, {"per_token_s", t.per_token}, {"per_pair_s", t.per_pair}};
}

CostTerms terms_from_json(const nlohmann::json& j) {
  return {j.at("fixed_s").get<double>(), j.at("per_token_s").get<double>(), j.at("per_pair_s").get<double>()};
}

// A batch of random tokens (the profile times the work, not what it learns).
Batch random_batch(int64_t b, int64_t T, int64_t vocab) {
  Batch batch;
  batch.batch = b, batch.seq_len = T;
  Rng rng(1234);
  for (int64_t i = 0; i < b * T; ++i) batch.tokens.push_back(int32_t(rng.uniform() * double(vocab)) % int32_t(vocab));
  for (int64_t i = 0; i < b * T; ++i) batch.targets.push_back((i + 1) % T ? batch.tokens[size_t(i + 1)] : -1);
  return batch;
}

}  // namespace

static CostModel profile_on_this_thread(const ProfileOptions& o, std::ostream& log);

std::vector<std::vector<int64_t>> profile_chunkings(int64_t T, int64_t multiple) {
  SF_CHECK(T >= 1 && multiple >= 1, "cost profile: the sequence length and multiple must be positive");
  return {from_fractions(T, multiple, {8, 4, 2, 1, 1}),
          from_fractions(T, multiple, {1, 1, 2, 4, 8}),
          from_fractions(T, multiple, {1, 1, 1, 1, 1, 1, 1, 1, 24})};
}

CostModel profile_costs(const ProfileOptions& o, std::ostream& log) {
  SF_CHECK(o.seq_len >= 1 && o.batch >= 1 && o.repeats >= 1, "cost profile: needs a sequence length, a batch and "
                                                             "at least one repeat");
  SF_CHECK(o.sm_parts >= 1 && (o.sm_parts == 1 || o.device == Device::CUDA),
           "cost profile: a profile on part of the SMs (--sm-split) needs --device cuda");
  if (o.sm_parts == 1) return profile_on_this_thread(o, log);
  // On part 0 of the SMs, as stage 0 of a split runs. A thread of its own: a part stays with the
  // thread that enters it, and one part may be current to one thread at a time.
  CostModel out;
  std::exception_ptr error;
  std::thread profiler([&] {
    try {
      const int sms = use_gpu_sm_partition(0, o.sm_parts);
      log << "cost profile: on " << sms << " SMs (one of " << o.sm_parts << " parts, as a --sm-split stage)\n";
      out = profile_on_this_thread(o, log);
    } catch (...) {
      error = std::current_exception();
    }
  });
  profiler.join();
  if (error) std::rethrow_exception(error);
  return out;
}

static CostModel profile_on_this_thread(const ProfileOptions& o, std::ostream& log) {
  using Clock = std::chrono::steady_clock;
  const auto started = Clock::now();
  MemoryTracker tracker("cost profile");
  CostModel out;
  const int n = Model::num_layers_of(o.model);
  const std::vector<std::string> kinds = layer_kinds(o.model);
  std::map<std::string, std::vector<CostSample>> forward, backward, stash, forward_work, backward_work;
  {
    TrackerScope scope(tracker);
    Model model(o.model, o.dtype, 0, n, o.device);
    AdamW optimizer(model.params(), AdamWConfig{});  // its state counts in the resident bytes
    const MemorySnapshot built = tracker.snapshot();
    log << "cost profile: model built, " << std::chrono::duration<double>(Clock::now() - started).count() << " s\n"
        << std::flush;
    const int64_t resident = built.current_of(MemCategory::Weights) + built.current_of(MemCategory::Grads) +
                             built.current_of(MemCategory::Optimizer);
    out.resident_bytes_per_parameter = double(resident) / double(o.model.num_parameters());
    out.input_bytes_per_value = o.device == Device::CPU ? double(dtype_size(o.dtype)) : 2.0;  // bf16 activations
    // One executor per layer, so that each layer's stash is measured on its own.
    std::vector<std::unique_ptr<StageExecutor>> layer;
    for (int i = 0; i < n; ++i) layer.push_back(std::make_unique<StageExecutor>(model.layers(i, i + 1), i));
    // One profile per layer for the whole run: a GPU profile's clock allocates pinned memory and
    // synchronises the device when it goes, which cost ~20 ms per layer call when made per call.
    for (auto& l : layer) l->set_profile(std::make_unique<LayerProfile>(o.device));
    const Batch batch = random_batch(o.batch, o.seq_len, o.model.vocab_size);
    const auto chunkings = profile_chunkings(o.seq_len, o.multiple);
    // One untimed pass (first calls allocate, pick algorithms), then the timed ones.
    for (int pass = 0; pass <= o.repeats * int(chunkings.size()); ++pass) {
      const bool timed = pass > 0;
      const std::vector<int64_t>& lengths = chunkings[size_t(std::max(pass - 1, 0)) % chunkings.size()];
      UnitPlan plan(batch, 1, lengths);
      LossStats stats;
      std::vector<Unit> units;
      auto sample = [&](const Unit& u, double value) {
        return CostSample{double(o.batch), double(u.ctx.len), double(u.ctx.offset), value};
      };
      auto seconds = [&](int i) { return layer[size_t(i)]->profile()->last_device_s(); };
      // A call's working memory: how far the tracked total rose above what is held before and after it.
      int64_t held_before = 0;
      auto start_call = [&] {
        tracker.reset_peaks();
        held_before = tracker.snapshot().total_current;
      };
      auto activations = [&] { return tracker.snapshot().current_of(MemCategory::Activations); };
      auto working_bytes = [&] {
        const MemorySnapshot m = tracker.snapshot();
        return double(m.total_peak - std::max(held_before, m.total_current));
      };
      for (int c = 0; c < plan.chunks(); ++c) {
        units.push_back(plan.make_unit(0, c, &stats));
        Tensor h = units.back().tokens;
        for (int i = 0; i < n; ++i) {
          auto activation_bytes = [](const Tensor& x) {
            return x.defined() && x.category() == MemCategory::Activations ? int64_t(x.nbytes()) : 0;
          };
          const int64_t before = activations();
          const int64_t input = i > 0 ? activation_bytes(h) : 0;  // layer 0's is the unit's tokens
          start_call();
          Tensor out = layer[size_t(i)]->forward(units.back().ctx, h);
          const double t = seconds(i), work = working_bytes();
          // What the layer keeps for its backward: its new activations less its output, plus its
          // input if it holds on to it (in a stage, the previous layer's output, which that layer's
          // stash does not count). Dropping our handle frees the input unless the layer keeps it;
          // either way the sum below is what it keeps.
          h = std::move(out);
          const int64_t kept = activations() - before - activation_bytes(h) + input;
          if (!timed) continue;
          forward[kinds[size_t(i)]].push_back(sample(units.back(), t));
          forward_work[kinds[size_t(i)]].push_back(sample(units.back(), work));
          stash[kinds[size_t(i)]].push_back(sample(units.back(), double(kept)));
        }
      }
      for (int c = plan.chunks() - 1; c >= 0; --c) {
        Tensor g;
        for (int i = n - 1; i >= 0; --i) {
          start_call();
          g = layer[size_t(i)]->backward(units[size_t(c)].ctx, g);
          const double t = seconds(i);
          if (!timed) continue;
          backward[kinds[size_t(i)]].push_back(sample(units[size_t(c)], t));
          backward_work[kinds[size_t(i)]].push_back(sample(units[size_t(c)], working_bytes()));
        }
      }
      log << "cost profile: " << (timed ? cat("pass ", pass, "/", o.repeats * chunkings.size()) : std::string("warm-up"))
          << " (chunks " << lengths.size() << "), " << std::chrono::duration<double>(Clock::now() - started).count()
          << " s since the start\n"
          << std::flush;
    }
  }
  if (o.device != Device::CPU) device_backend(o.device).release_memory(tracker);
  for (const auto& [kind, samples] : forward) {
    // Attention-like kinds (a boundary state that grows with the chunks) get the pair term.
    bool pairs = false;
    for (const Mixer* m : all_mixers())
      if (kind == m->name + "_block")
        for (const StateTensorSpec& t : m->boundary_state(o.model)) pairs = pairs || t.grows_with_chunks;
    PassCosts& p = out.kinds[kind];
    p.forward = fit_cost_terms(samples, pairs);
    p.backward = fit_cost_terms(backward[kind], pairs);
    double bytes = 0, tokens = 0;
    for (const CostSample& x : stash[kind]) bytes += x.value, tokens += x.b * x.s;
    p.stash_bytes_per_token = tokens > 0 ? bytes / tokens : 0;
    p.work = {{fit_work_terms(forward_work[kind]), fit_work_terms(backward_work[kind]), p.stash_bytes_per_token}};
  }
  return out;
}

std::string default_profile_dir() {
  if (const char* d = std::getenv("STATEFLOW_CACHE_DIR"); d && *d) return d;
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d) return std::string(d) + "/stateflow";
  if (const char* d = std::getenv("HOME"); d && *d) return std::string(d) + "/.cache/stateflow";
  return ".stateflow-cache";
}

std::string cost_profile_path(const ProfileOptions& o, const std::string& dir) {
  const std::string key = profile_key(o).dump();
  char name[64];
  std::snprintf(name, sizeof name, "costs-%s-%08x.json", o.model.name.c_str(), crc32(key.data(), key.size()));
  return dir + "/" + name;
}

nlohmann::json cost_model_json(const CostModel& c) {
  nlohmann::json kinds = nlohmann::json::object();
  for (const auto& [kind, p] : c.kinds)
    kinds[kind] = {{"forward", terms_json(p.forward)},
                   {"backward", terms_json(p.backward)},
                   {"stash_bytes_per_token", p.stash_bytes_per_token},
                   {"forward_work", work_json(p.work.empty() ? WorkTerms{} : p.work.front().forward)},
                   {"backward_work", work_json(p.work.empty() ? WorkTerms{} : p.work.front().backward)}};
  return {{"kinds", kinds},
          {"resident_bytes_per_parameter", c.resident_bytes_per_parameter},
          {"input_bytes_per_value", c.input_bytes_per_value}};
}

CostModel cost_model_from_json(const nlohmann::json& j, const std::string& where) {
  try {
    CostModel c;
    for (const auto& item : j.at("kinds").items()) {
      const nlohmann::json& p = item.value();  // a named reference: lambdas may not capture bindings
      const double stash = p.at("stash_bytes_per_token").get<double>();
      // Profiles written before working memory was measured have none.
      auto work = [&](const char* name) { return p.contains(name) ? work_from_json(p.at(name)) : WorkTerms{}; };
      c.kinds[item.key()] = {terms_from_json(p.at("forward")), terms_from_json(p.at("backward")), stash,
                       {{work("forward_work"), work("backward_work"), stash}}};
    }
    c.resident_bytes_per_parameter = j.at("resident_bytes_per_parameter").get<double>();
    c.input_bytes_per_value = j.at("input_bytes_per_value").get<double>();
    return c;
  } catch (const nlohmann::json::exception& e) {
    fail("cost profile ", where, " is not a stateflow cost model (", e.what(), "); delete it to profile again");
  }
}

CostModel cost_model_from_file(const std::string& path, nlohmann::json* key) {
  std::ifstream in(path);
  SF_CHECK(in.good(), "cannot read the cost profile '", path, "'");
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  SF_CHECK(!j.is_discarded() && j.is_object() && j.contains("costs") && j.contains("key"), "'", path,
           "' is not a cost profile (one is written by stateflow plan --auto under --profile-dir)");
  if (key) *key = j["key"];
  return cost_model_from_json(j["costs"], path);
}

std::string profile_model_mismatch(const nlohmann::json& profiled, const ModelConfig& m) {
  if (!profiled.is_object()) return "the profile names no model";
  nlohmann::json theirs;
  try {  // through the config parser, so a field added since the profile was made takes its default
    theirs = ModelConfig::from_json(profiled).to_json();
  } catch (const std::exception& e) {
    return cat("its model does not parse here: ", e.what());
  }
  const nlohmann::json mine = m.to_json();
  const std::string blocks = m.blocks();
  for (const auto& [field, value] : mine.items()) {
    if (field == "name" || field == "pattern" || field == "seed" || field == "init_std") continue;
    const Mixer* mixer = find_mixer(field);
    if (mixer && blocks.find(mixer->letter) == std::string::npos) continue;  // a section m does not use
    const nlohmann::json there = theirs.value(field, nlohmann::json());
    if (there != value) return cat("'", field, "' is ", there.dump(), " there and ", value.dump(), " here");
  }
  return "";
}

bool profile_prices_model(const nlohmann::json& profiled, const ModelConfig& m) {
  return profile_model_mismatch(profiled, m).empty();
}

CostModel cached_cost_model(const ProfileOptions& o, const std::string& dir, std::ostream& log) {
  const std::string path = cost_profile_path(o, dir);
  const nlohmann::json key = profile_key(o);
  if (std::ifstream in(path); in.good()) {
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (!j.is_discarded() && j.is_object() && j.value("key", nlohmann::json()) == key) {
      log << "cost profile: " << path << " (cached)\n";
      return cost_model_from_json(j.at("costs"), path);
    }
  }
  log << "cost profile: measuring " << o.model.name << " on " << key["device"].get<std::string>() << ", "
      << o.batch << " x " << o.seq_len << " tokens per pass\n";
  const CostModel c = profile_costs(o, log);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  std::ofstream f(path);
  if (f.good()) {
    f << nlohmann::json{{"key", key}, {"costs", cost_model_json(c)}}.dump(2) << "\n";
    log << "cost profile: saved " << path << "\n";
  } else {
    log << "cost profile: could not write " << path << " (not cached)\n";
  }
  return c;
}

CostModel recorded_cost_model(const std::string& path, const ProfileOptions& run, std::ostream& log) {
  nlohmann::json key;
  CostModel costs = cost_model_from_file(path, &key);
  const nlohmann::json model = key.value("model", nlohmann::json());
  const std::string profiled = model.is_object() ? model.value("name", std::string("?")) : std::string("?");
  const std::string mismatch = profile_model_mismatch(model, run.model);
  SF_CHECK(mismatch.empty(), "the cost profile '", path, "' was measured on model '", profiled,
           "', whose layers are not this one's ('", run.model.name, "': ", mismatch,
           "): give that model's --preset/--config/--pattern, or profile this one (leave out --cost-profile)");
  const std::string where = key.value("device", std::string());
  SF_CHECK(where.rfind(device_name(run.device), 0) == 0, "the cost profile '", path, "' was measured on '", where,
           "': give --device ", where.substr(0, where.find(' ')));
  const int parts = key.value("sm_parts", 1);
  SF_CHECK(parts == run.sm_parts, "the cost profile '", path, "' was measured on ",
           parts > 1 ? cat("1/", parts, " of the GPU's SMs") : std::string("the whole device"), ", but this run ",
           run.sm_parts > 1 ? cat("splits the SMs ", run.sm_parts, " ways (--sm-split, --stages ", run.sm_parts, ")")
                            : std::string("gives each stage a whole device"),
           ": give a profile measured the way this run runs, or leave out --cost-profile to profile here");
  log << "cost profile: " << path << " (recorded: " << where << (parts > 1 ? cat(", 1/", parts, " of its SMs") : "")
      << ", " << key.value("batch", 0) << " x " << key.value("seq_len", 0) << " tokens per pass)\n";
  if (profiled != run.model.name)
    log << "cost profile: measured on " << profiled << ", whose layer kinds have " << run.model.name << "'s shapes\n";
  return costs;
}

}  // namespace stateflow
