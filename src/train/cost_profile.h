// Measures the chunk cost model (pipeline/chunk_cost.h) on the device a run is on: the whole
// model as one stage on one device (two stages sharing a device would time each other's
// contention), every layer's forward and backward timed on its own (layer_profile.h) for units
// of several chunk lengths and prefixes, and each layer kind's terms fitted by least squares.
// It also measures what each layer's forward keeps for its backward (bytes per token) and the
// resident bytes per parameter. The result is cached in a file keyed by the model, precision,
// device, unit shape and the stateflow binary, so a second plan or run reuses it.
#pragma once
#include <iosfwd>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "core/device.h"
#include "core/dtype.h"
#include "model/config.h"
#include "pipeline/chunk_cost.h"

namespace stateflow {

struct ProfileOptions {
  ModelConfig model = model_preset("tiny");
  DType dtype = DType::F32;
  Device device = Device::CPU;
  int64_t batch = 1;    // sequences per unit (the run's microbatch)
  int64_t seq_len = 0;  // the run's sequence length: chunks and prefixes span it
  int64_t multiple = 64;  // profiled chunk lengths are multiples of this (the kernels' block)
  int repeats = 1;        // timed passes over each chunking (after one untimed warm-up pass)
  // GPU: profile on one of this many equal parts of the SMs, as each stage of a --sm-split run
  // of that many stages runs (1: the whole GPU).
  int sm_parts = 1;
};

// The chunkings the profile runs (each sums to seq_len): long chunks early, long chunks late,
// many short ones, so that the fixed, per-token and per-pair terms can be told apart.
std::vector<std::vector<int64_t>> profile_chunkings(int64_t seq_len, int64_t multiple);

// Runs the profile now; a line per pass to `log`.
CostModel profile_costs(const ProfileOptions& o, std::ostream& log);

// The cache file for these options under `dir` (the key's hash in the name).
std::string cost_profile_path(const ProfileOptions& o, const std::string& dir);
// The default cache directory: $STATEFLOW_CACHE_DIR, else $XDG_CACHE_HOME/stateflow, else
// $HOME/.cache/stateflow, else .stateflow-cache.
std::string default_profile_dir();
// The cached profile when its key matches, else a new profile, written to the cache.
CostModel cached_cost_model(const ProfileOptions& o, const std::string& dir, std::ostream& log);

nlohmann::json cost_model_json(const CostModel& c);
// Throws Error naming `where` when the JSON is not a cost model.
CostModel cost_model_from_json(const nlohmann::json& j, const std::string& where);
// A profile file as the cache writes it (e.g. one measured on a GPU machine and copied here, so
// that a machine without that GPU plans for it): its cost model, and in `key` what was measured
// where (model, precision, device, unit shape, build). Throws Error naming the file.
CostModel cost_model_from_file(const std::string& path, nlohmann::json* key = nullptr);
// Whether a profile of the model `profiled` (its config JSON, from the profile's key) prices
// model m: every layer kind m has was profiled at m's shapes (the same width, vocabulary, MLP
// and the sections of the mixers m uses; names, patterns, seeds and unused mixers aside). A
// hybrid's profile so prices the pure model of its GDN blocks.
// Fields the profile's JSON lacks (made before they existed) take their defaults.
bool profile_prices_model(const nlohmann::json& profiled, const ModelConfig& m);
// Why it does not: the first field that differs, with both values ("" when it prices m).
std::string profile_model_mismatch(const nlohmann::json& profiled, const ModelConfig& m);
// A recorded profile file to price a run profiled with options `run` instead: its model must
// price run.model (profile_prices_model), and its device kind and SM split (sm_parts) must be
// the run's. Throws Error naming the file and the fix; logs what it read.
CostModel recorded_cost_model(const std::string& path, const ProfileOptions& run, std::ostream& log);

}  // namespace stateflow
