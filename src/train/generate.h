// Sampling text from a model: the prompt runs through RecurrentForward as chunks, then each
// new token goes in alone, one step at a time, through the same boundary states (recurrent
// inference: the memory per token is constant, whatever the length).
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "core/rng.h"
#include "train/recurrent_forward.h"

namespace stateflow {

struct GenerateConfig {
  int64_t max_new_tokens = 64;
  double temperature = 1.0;  // 0: greedy (argmax)
  int64_t top_k = 0;         // sample among the k most likely tokens; 0: all
  uint64_t seed = 0;
  int64_t prompt_chunk = 0;  // tokens per chunk of the prompt; 0: the whole prompt at once
  int32_t stop_token = -1;   // stop after generating this id; -1: never
  void validate() const;     // errors name the option
};

// The next token from one row of logits [vocab] (any float dtype, on the host): argmax when
// temperature is 0, else a draw from softmax(logits / temperature) restricted to the top_k.
int32_t sample_token(const Tensor& logits, int64_t row, double temperature, int64_t top_k, Rng& rng);

// Starts new sequences (reset), runs the prompt (at least one token), then generates; calls
// on_token with each new id as soon as it is drawn. Returns the new ids.
std::vector<int32_t> generate(RecurrentForward& model, const std::vector<int32_t>& prompt, const GenerateConfig& cfg,
                              const std::function<void(int32_t)>& on_token = {});

}  // namespace stateflow
