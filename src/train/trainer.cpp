#include "train/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <ostream>

#include "train/chunking.h"
#include "train/lr_schedule.h"
#include "train/step.h"

namespace stateflow {

std::vector<int64_t> TrainOptions::resolved_chunk_lengths() const {
  if (!chunk_lengths.empty()) {
    validate_chunk_lengths(chunk_lengths, seq_len);
    return chunk_lengths;
  }
  return even_chunk_lengths(seq_len, chunks);
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
  SF_CHECK(warmup >= 0 && warmup <= steps, "--warmup must be in [0, steps], got ", warmup);
  SF_CHECK(log_every >= 1, "--log-every must be at least 1, got ", log_every);
  adamw.validate();
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
  chunk_lengths_ = opts_.resolved_chunk_lengths();
  DataConfig dc = opts_.data;
  if (dc.kind == "recall" && dc.vocab_size == 0) dc.vocab_size = opts_.model.vocab_size;
  data_ = make_data_source(dc);
  SF_CHECK(data_->vocab_size() <= opts_.model.vocab_size, "the data uses ", data_->vocab_size(),
           " token ids but the model's vocab_size is ", opts_.model.vocab_size,
           ": raise vocab_size in the model config");
  model_ = std::make_unique<Model>(opts_.model, opts_.dtype);
  optimizer_ = std::make_unique<AdamW>(model_->params(), opts_.adamw);
}

StepReport Trainer::step() {
  auto t0 = std::chrono::steady_clock::now();
  Batch batch = data_->next(opts_.batch, opts_.seq_len);
  std::vector<Param*> params = model_->params();
  zero_grads(params);
  StepLoss sl = forward_backward(*model_, batch, opts_.microbatches, chunk_lengths_);
  SF_CHECK(std::isfinite(sl.loss), "step ", step_, ": the loss is ", sl.loss,
           "; lower --lr or check the data (the weights were not updated)");
  StepReport r;
  r.step = step_;
  r.grad_norm = clip_grad_norm(params, opts_.clip);
  SF_CHECK(std::isfinite(r.grad_norm), "step ", step_, ": the gradient norm is ", r.grad_norm,
           "; lower --lr (the weights were not updated)");
  LrSchedule sched{opts_.lr, opts_.min_lr, opts_.warmup, opts_.steps};
  r.lr = sched.at(step_);
  optimizer_->step(r.lr);
  r.loss = sl.loss;
  r.accuracy = sl.stats.counted ? double(sl.stats.correct) / double(sl.stats.counted) : 0.0;
  r.tokens = batch.batch * batch.seq_len;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ++step_;
  return r;
}

std::vector<StepReport> Trainer::run(std::ostream& log) {
  log << "model " << opts_.model.name << ": " << opts_.model.num_parameters() << " parameters, "
      << opts_.model.n_layers << " GDN blocks, d_model " << opts_.model.d_model << ", " << dtype_name(opts_.dtype)
      << "\ndata: " << data_->describe() << "\nbatch " << opts_.batch << " x " << opts_.seq_len << " tokens, "
      << opts_.microbatches << " microbatch(es), chunks " << format_chunk_lengths(chunk_lengths_) << "\n";
  std::vector<StepReport> out;
  double window_tokens = 0, window_seconds = 0;
  for (int64_t i = 0; i < opts_.steps; ++i) {
    out.push_back(step());
    const StepReport& r = out.back();
    window_tokens += r.tokens, window_seconds += r.seconds;
    if ((i + 1) % opts_.log_every == 0 || i + 1 == opts_.steps) {
      char line[256];
      std::snprintf(line, sizeof line, "step %5lld/%lld  loss %.4f  acc %.3f  |g| %.3f  lr %.2e  %.0f tok/s",
                    (long long)r.step + 1, (long long)opts_.steps, r.loss, r.accuracy, r.grad_norm, r.lr,
                    window_tokens / window_seconds);
      log << line << "  mem " << format_peak_memory(current_tracker().snapshot()) << "\n" << std::flush;
      window_tokens = window_seconds = 0;
    }
  }
  return out;
}

}  // namespace stateflow
