#include "train/evaluate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "core/error.h"

namespace stateflow {

void EvalConfig::validate() const {
  SF_CHECK(tokens >= 1, "--eval-tokens must be at least 1, got ", tokens);
  SF_CHECK(batch >= 1, "evaluation batch must be at least 1, got ", batch);
  SF_CHECK(seq_len >= 1, "evaluation --seq-len must be at least 1, got ", seq_len);
  SF_CHECK(chunk_len >= 0, "--chunk-len must be >= 0 (0: whole sequences), got ", chunk_len);
}

// Copies a chunk's logits [batch * len, V] into rows [off, off + len) of each sequence of the
// batch's logits [batch * seq_len, V].
static void place_chunk_logits(const Tensor& chunk, Tensor& all, int64_t batch, int64_t seq_len, int64_t off) {
  const int64_t len = chunk.dim(0) / batch, row_bytes = chunk.nbytes() / chunk.dim(0);
  for (int64_t s = 0; s < batch; ++s)
    std::memcpy(static_cast<char*>(all.raw()) + (s * seq_len + off) * row_bytes,
                static_cast<const char*>(chunk.raw()) + s * len * row_bytes, len * row_bytes);
}

EvalResult evaluate(RecurrentForward& model, DataSource& data, const EvalConfig& cfg, Tensor* first_batch_logits) {
  cfg.validate();
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t per_batch = cfg.batch * cfg.seq_len;
  const int64_t batches = (cfg.tokens + per_batch - 1) / per_batch;
  const int64_t chunk = cfg.chunk_len ? std::min(cfg.chunk_len, cfg.seq_len) : cfg.seq_len;
  LossStats stats;
  std::vector<int32_t> tokens, targets;
  for (int64_t b = 0; b < batches; ++b) {
    const Batch batch = data.next(cfg.batch, cfg.seq_len);
    model.reset();
    for (int64_t off = 0; off < cfg.seq_len; off += chunk) {
      const int64_t len = std::min(chunk, cfg.seq_len - off);
      tokens.resize(cfg.batch * len), targets.resize(cfg.batch * len);
      for (int64_t s = 0; s < cfg.batch; ++s)
        for (int64_t t = 0; t < len; ++t) {
          tokens[s * len + t] = batch.tokens[s * cfg.seq_len + off + t];
          targets[s * len + t] = batch.targets[s * cfg.seq_len + off + t];
        }
      if (b == 0 && first_batch_logits) {
        Tensor logits;
        model.forward(tokens, targets, cfg.batch, &stats, &logits);
        if (off == 0)
          *first_batch_logits = Tensor::zeros({cfg.batch * cfg.seq_len, logits.dim(1)}, logits.dtype(), MemCategory::Other);
        place_chunk_logits(logits, *first_batch_logits, cfg.batch, cfg.seq_len, off);
      } else {
        model.forward(tokens, targets, cfg.batch, &stats);
      }
    }
  }
  EvalResult r;
  r.tokens = static_cast<int64_t>(stats.counted);
  r.batches = batches;
  r.loss = stats.counted ? stats.loss_sum / double(stats.counted) : 0.0;
  r.perplexity = std::exp(r.loss);
  r.accuracy = stats.counted ? double(stats.correct) / double(stats.counted) : 0.0;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

std::string format_eval(const EvalResult& r) {
  char line[160];
  std::snprintf(line, sizeof line, "loss %.4f  ppl %.2f  acc %.3f  (%lld tokens, %.1f s)", r.loss, r.perplexity,
                r.accuracy, static_cast<long long>(r.tokens), r.seconds);
  return line;
}

}  // namespace stateflow
