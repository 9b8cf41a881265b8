#include "train/train_options.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <type_traits>

#include "pipeline/chunking.h"

namespace stateflow {

using nlohmann::json;

std::vector<int64_t> TrainOptions::resolved_chunk_lengths() const {
  if (!chunk_lengths.empty()) {
    validate_chunk_lengths(chunk_lengths, seq_len);
    return chunk_lengths;
  }
  return even_chunk_lengths(seq_len, chunks);
}

PipelineConfig TrainOptions::pipeline_config() const {
  PipelineConfig pc;
  pc.model = model;
  pc.dtype = dtype;
  pc.device = device;
  pc.stages = stages;
  pc.data_parallel = data_parallel;
  pc.bucket_bytes = std::max<int64_t>(1, int64_t(bucket_mb * (1 << 20)));
  pc.microbatches = microbatches;
  pc.chunk_lengths = resolved_chunk_lengths();
  pc.schedule = parse_schedule_kind(schedule);
  pc.adamw = adamw;
  pc.clip = clip;
  pc.timeout_s = timeout_s;
  pc.recompute = recompute;
  pc.split_sms = split_sms;
  return pc;
}

void TrainOptions::validate() const {
  model.validate();
  SF_CHECK(steps >= 1, "--steps must be at least 1, got ", steps);
  SF_CHECK(batch >= 1, "--batch must be at least 1, got ", batch);
  SF_CHECK(seq_len >= 1, "--seq-len must be at least 1, got ", seq_len);
  const int64_t max_tokens = int64_t(1) << 31;  // token ids of a step are int32 arrays
  SF_CHECK(batch <= max_tokens / seq_len, "--batch ", batch, " x --seq-len ", seq_len,
           " tokens per step is more than the ", max_tokens, " accepted; use fewer sequences or shorter ones");
  SF_CHECK(stages >= 1, "--stages must be at least 1, got ", stages);
  SF_CHECK(microbatches >= 1 && batch % microbatches == 0, "--microbatches ", microbatches,
           " must be at least 1 and divide --batch ", batch);
  SF_CHECK(data_parallel >= 0, "--data-parallel must be at least 1 (or 0: world size / --stages), got ", data_parallel);
  SF_CHECK(data_parallel == 0 || batch % (int64_t(data_parallel) * microbatches) == 0, "--batch ", batch,
           " must be a multiple of --data-parallel ", data_parallel, " x --microbatches ", microbatches,
           ": each replica takes --batch / --data-parallel sequences and splits them into microbatches");
  SF_CHECK(bucket_mb > 0, "--bucket-mb must be positive, got ", bucket_mb);
  SF_CHECK(lr > 0 && lr < 1, "--lr must be in (0, 1), got ", lr);
  SF_CHECK(min_lr >= 0 && min_lr <= lr, "--min-lr must be in [0, lr], got ", min_lr);
  SF_CHECK(warmup >= 0, "--warmup must be >= 0, got ", warmup);
  SF_CHECK(log_every >= 1, "--log-every must be at least 1, got ", log_every);
  SF_CHECK(clip >= 0, "--clip must be >= 0 (0 turns clipping off), got ", clip);
  SF_CHECK(timeout_s > 0, "--timeout must be positive, got ", timeout_s);
  SF_CHECK(save_every >= 0, "--save-every must be >= 0 (0: save only at the end and when stopped), got ",
           save_every);
  SF_CHECK(save_every == 0 || !save_dir.empty(), "--save-every ", save_every, " needs --save-dir DIR to save into");
  SF_CHECK(keep >= 0, "--keep must be >= 0 (0 keeps every checkpoint), got ", keep);
  SF_CHECK(eval_every >= 0, "--eval-every must be >= 0 (0: evaluate only at the end), got ", eval_every);
  SF_CHECK(eval_tokens >= 1, "--eval-tokens must be at least 1, got ", eval_tokens);
  SF_CHECK(!eval_data.kind.empty() || eval_every == 0, "--eval-every ", eval_every,
           " needs held-out data to evaluate on: pass --eval-data KIND --eval-data-path FILE");
  adamw.validate();
  parse_schedule_kind(schedule);
  resolved_chunk_lengths();
}

// Every field but the model and dtype, named once for both directions of the JSON form.
template <class Options, class Fn>
static void visit_fields(Options& o, Fn&& field) {
  field("steps", o.steps), field("batch", o.batch), field("seq_len", o.seq_len);
  field("stages", o.stages), field("microbatches", o.microbatches);
  field("data_parallel", o.data_parallel), field("bucket_mb", o.bucket_mb);
  field("chunks", o.chunks), field("chunk_lengths", o.chunk_lengths), field("schedule", o.schedule);
  field("transport", o.transport), field("timeout_s", o.timeout_s), field("recompute", o.recompute);
  field("lr", o.lr), field("min_lr", o.min_lr), field("warmup", o.warmup);
  field("adam_beta1", o.adamw.beta1), field("adam_beta2", o.adamw.beta2), field("adam_eps", o.adamw.eps);
  field("weight_decay", o.adamw.weight_decay), field("clip", o.clip);
  field("log_every", o.log_every), field("trace_path", o.trace_path), field("metrics_path", o.metrics_path);
  field("save_dir", o.save_dir), field("save_every", o.save_every), field("keep", o.keep);
  field("resume", o.resume), field("skip_nonfinite", o.skip_nonfinite);
  field("data_kind", o.data.kind), field("data_path", o.data.path), field("data_vocab_size", o.data.vocab_size);
  field("data_seed", o.data.seed), field("recall_pairs", o.data.recall.num_pairs);
  field("recall_queries", o.data.recall.num_queries), field("recall_noise_tokens", o.data.recall.noise_tokens);
  field("eval_data_kind", o.eval_data.kind), field("eval_data_path", o.eval_data.path);
  field("eval_every", o.eval_every), field("eval_tokens", o.eval_tokens);
}

json TrainOptions::to_json() const {
  json j = {{"model", model.to_json()}, {"dtype", dtype_name(dtype)}};
  visit_fields(*this, [&](const char* name, const auto& v) { j[name] = v; });
  return j;
}

TrainOptions TrainOptions::from_json(const json& j) {
  SF_CHECK(j.is_object(), "train options must be a JSON object");
  TrainOptions o;
  size_t known = 0;
  auto take = [&](const char* name, auto& v) {
    if (!j.contains(name)) return;
    ++known;
    const json& x = j.at(name);
    // Checked before get_to(): a float read as an integer would be truncated, or be
    // undefined behaviour when out of range.
    using T = std::remove_reference_t<decltype(v)>;
    bool ok = false;
    if constexpr (std::is_same_v<T, bool>) ok = x.is_boolean();
    else if constexpr (std::is_unsigned_v<T>) ok = x.is_number_unsigned();
    else if constexpr (std::is_integral_v<T>) ok = x.is_number_integer();
    else if constexpr (std::is_floating_point_v<T>) ok = x.is_number();
    else if constexpr (std::is_same_v<T, std::string>) ok = x.is_string();
    else ok = x.is_array() && std::all_of(x.begin(), x.end(), [](const json& e) { return e.is_number_integer(); });
    SF_CHECK(ok, "train options: field '", name, "' has the wrong type (", x.type_name(), ")");
    x.get_to(v);
  };
  visit_fields(o, take);
  if (j.contains("model")) ++known, o.model = ModelConfig::from_json(j.at("model"));
  if (j.contains("dtype")) {
    ++known;
    SF_CHECK(j.at("dtype").is_string(), "train options: field 'dtype' must be a string");
    o.dtype = parse_dtype(j.at("dtype").get<std::string>());
  }
  if (known != j.size()) {
    TrainOptions probe;
    for (auto it = j.begin(); it != j.end(); ++it) {
      bool found = it.key() == "model" || it.key() == "dtype";
      visit_fields(probe, [&](const char* name, auto&) { found = found || it.key() == name; });
      SF_CHECK(found, "train options: unknown field '", it.key(), "'");
    }
  }
  o.validate();
  return o;
}

}  // namespace stateflow
