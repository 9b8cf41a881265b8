#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ostream>

#include "pipeline/launch.h"
#include "train/chunking.h"
#include "train/lr_schedule.h"

namespace stateflow {

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
  pc.microbatches = microbatches;
  pc.chunk_lengths = resolved_chunk_lengths();
  pc.schedule = parse_schedule_kind(schedule);
  pc.adamw = adamw;
  pc.clip = clip;
  pc.timeout_s = timeout_s;
  pc.recompute = recompute;
  return pc;
}

void TrainOptions::validate() const {
  model.validate();
  SF_CHECK(steps >= 1, "--steps must be at least 1, got ", steps);
  SF_CHECK(batch >= 1, "--batch must be at least 1, got ", batch);
  SF_CHECK(seq_len >= 1, "--seq-len must be at least 1, got ", seq_len);
  SF_CHECK(microbatches >= 1 && batch % microbatches == 0, "--microbatches ", microbatches,
           " must be at least 1 and divide --batch ", batch);
  SF_CHECK(lr > 0 && lr < 1, "--lr must be in (0, 1), got ", lr);
  SF_CHECK(min_lr >= 0 && min_lr <= lr, "--min-lr must be in [0, lr], got ", min_lr);
  SF_CHECK(warmup >= 0, "--warmup must be >= 0, got ", warmup);
  SF_CHECK(log_every >= 1, "--log-every must be at least 1, got ", log_every);
  SF_CHECK(clip >= 0, "--clip must be >= 0 (0 turns clipping off), got ", clip);
  SF_CHECK(timeout_s > 0, "--timeout must be positive, got ", timeout_s);
  adamw.validate();
  parse_schedule_kind(schedule);
  resolved_chunk_lengths();
}

std::string format_peak_memory(const MemorySnapshot& s) {
  std::string out;
  for (int c = 0; c < kNumMemCategories; ++c) {
    if (!s.peak[c]) continue;
    out += (out.empty() ? "" : ", ") + std::string(mem_category_name(MemCategory(c))) + " " + format_bytes(s.peak[c]);
  }
  return out + " | total " + format_bytes(s.total_peak);
}

Trainer::Trainer(const TrainOptions& opts) : opts_(opts) {
  opts_.validate();
  DataConfig dc = opts_.data;
  if (dc.kind == "recall" && dc.vocab_size == 0) dc.vocab_size = opts_.model.vocab_size;
  data_ = make_data_source(dc);
  SF_CHECK(data_->vocab_size() <= opts_.model.vocab_size, "the data uses ", data_->vocab_size(),
           " token ids but the model's vocab_size is ", opts_.model.vocab_size,
           ": raise vocab_size in the model config");
  pipeline_ = make_pipeline(opts_.pipeline_config(), opts_.transport);
}

StepReport Trainer::step() {
  auto t0 = std::chrono::steady_clock::now();
  Batch batch = data_->next(opts_.batch, opts_.seq_len);
  pipeline_->zero_grads();
  last_ = pipeline_->forward_backward(batch);
  SF_CHECK(std::isfinite(last_.loss), "step ", step_, ": the loss is ", last_.loss,
           "; lower --lr or check the data (the weights were not updated)");
  StepReport r;
  r.step = step_;
  // A run shorter than the warmup warms up over the whole run.
  r.lr = LrSchedule{opts_.lr, opts_.min_lr, std::min(opts_.warmup, opts_.steps), opts_.steps}.at(step_);
  r.grad_norm = pipeline_->clip_and_update(r.lr);
  r.loss = last_.loss;
  r.accuracy = last_.stats.counted ? double(last_.stats.correct) / double(last_.stats.counted) : 0.0;
  r.tokens = batch.batch * batch.seq_len;
  r.bubble_fraction = last_.bubble_fraction;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ++step_;
  return r;
}

std::vector<StepReport> Trainer::run(std::ostream& log) {
  const bool report = is_reporting_rank(*pipeline_);
  const PipelineConfig pc = pipeline_->config();
  if (report)
    log << "model " << opts_.model.name << ": " << opts_.model.num_parameters() << " parameters, "
        << opts_.model.n_layers << " GDN blocks, d_model " << opts_.model.d_model << ", " << dtype_name(opts_.dtype)
        << " on " << device_name(opts_.device)
        << "\ndata: " << data_->describe() << "\nbatch " << opts_.batch << " x " << opts_.seq_len << " tokens; "
        << kind_name(pc.schedule) << " schedule over " << pc.stages << " stage(s) (" << opts_.transport
        << " transport), " << pc.microbatches << " microbatch(es), chunks " << format_chunk_lengths(pc.chunk_lengths)
        << (pc.recompute ? ", full recomputation" : "") << "\n";
  std::vector<StepReport> out;
  double window_tokens = 0, window_seconds = 0;
  for (int64_t i = 0; i < opts_.steps; ++i) {
    out.push_back(step());
    const StepReport& r = out.back();
    window_tokens += r.tokens, window_seconds += r.seconds;
    if (report && ((i + 1) % opts_.log_every == 0 || i + 1 == opts_.steps)) {
      char line[256];
      std::snprintf(line, sizeof line,
                    "step %5lld/%lld  loss %.4f  acc %.3f  |g| %.3f  lr %.2e  %.0f tok/s  bubble %.2f",
                    (long long)r.step + 1, (long long)opts_.steps, r.loss, r.accuracy, r.grad_norm, r.lr,
                    window_tokens / window_seconds, r.bubble_fraction);
      log << line << "\n";
      for (Stage* s : pipeline_->stages())
        log << "    stage " << s->rank() << " peak: " << format_peak_memory(s->tracker().snapshot()) << "\n";
      log << std::flush;
      window_tokens = window_seconds = 0;
    }
  }
  if (!opts_.trace_path.empty()) {
    std::vector<TimedAction> timeline;
    for (auto& s : last_.stages) timeline.insert(timeline.end(), s.timeline.begin(), s.timeline.end());
    write_chrome_trace(opts_.trace_path, trace_events(timeline, 1e6));
    if (report) log << "trace of the last step: " << opts_.trace_path << "\n";
  }
  return out;
}

}  // namespace stateflow
