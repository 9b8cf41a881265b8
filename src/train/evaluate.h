// Held-out evaluation: loss, perplexity and next-token accuracy of a model on batches of a
// data source, each sequence run chunk by chunk through RecurrentForward with the recurrent
// state carried, so a sequence of any length is evaluated in the memory of one chunk. The
// result does not depend on the chunk length (tests/test_evaluate.cpp: chunked == unchunked).
#pragma once
#include <cstdint>
#include <string>

#include "train/data.h"
#include "train/recurrent_forward.h"

namespace stateflow {

struct EvalConfig {
  int64_t tokens = 0;      // evaluate at least this many tokens (whole batches), >= 1
  int64_t batch = 1;       // sequences run side by side
  int64_t seq_len = 0;     // tokens per sequence (its state starts at zero)
  int64_t chunk_len = 0;   // tokens per chunk; 0: the whole sequence at once
  void validate() const;   // errors name the option (--eval-tokens, ...)
};

struct EvalResult {
  double loss = 0;        // mean cross-entropy (nats) over the counted targets
  double perplexity = 0;  // exp(loss)
  double accuracy = 0;    // argmax == target over the counted targets
  int64_t tokens = 0;     // targets counted (recall data: the answers only)
  int64_t batches = 0;
  double seconds = 0;
};

// Draws ceil(tokens / (batch * seq_len)) batches from `data` from where it stands. With
// first_batch_logits, also keeps the first batch's logits [batch * seq_len, vocab] (host, rows
// in the batch's order), e.g. to compare with another framework.
EvalResult evaluate(RecurrentForward& model, DataSource& data, const EvalConfig& cfg,
                    Tensor* first_batch_logits = nullptr);

// "loss 2.3456  ppl 10.45  acc 0.412  (12288 tokens, 1.2 s)"
std::string format_eval(const EvalResult& r);

}  // namespace stateflow
