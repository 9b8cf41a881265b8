#include "train/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace stateflow {

void GenerateConfig::validate() const {
  SF_CHECK(max_new_tokens >= 0, "--max-new-tokens must be >= 0, got ", max_new_tokens);
  SF_CHECK(temperature >= 0 && std::isfinite(temperature), "--temperature must be >= 0 (0: greedy), got ",
           temperature);
  SF_CHECK(top_k >= 0, "--top-k must be >= 0 (0: every token), got ", top_k);
  SF_CHECK(prompt_chunk >= 0, "--prompt-chunk must be >= 0 (0: the whole prompt at once), got ", prompt_chunk);
}

int32_t sample_token(const Tensor& logits, int64_t row, double temperature, int64_t top_k, Rng& rng) {
  const int64_t V = logits.dim(1);
  std::vector<double> l(V);
  dispatch_float(logits.dtype(), [&](auto z) {
    const auto* p = logits.data<decltype(z)>() + row * V;
    for (int64_t i = 0; i < V; ++i) l[i] = static_cast<double>(p[i]);
  });
  if (temperature == 0) return static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
  std::vector<int32_t> ids(V);
  std::iota(ids.begin(), ids.end(), 0);
  const int64_t k = top_k ? std::min(top_k, V) : V;
  // Ties go to the lower id, so a draw depends only on the logits and the seed.
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                    [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
  std::vector<double> w(k);
  for (int64_t i = 0; i < k; ++i) w[i] = std::exp((l[ids[i]] - l[ids[0]]) / temperature);
  double u = rng.uniform() * std::accumulate(w.begin(), w.end(), 0.0);
  for (int64_t i = 0; i < k; ++i)
    if ((u -= w[i]) < 0) return ids[i];
  return ids[k - 1];  // u landed on the sum's rounding
}

std::vector<int32_t> generate(RecurrentForward& model, const std::vector<int32_t>& prompt, const GenerateConfig& cfg,
                              const std::function<void(int32_t)>& on_token) {
  cfg.validate();
  SF_CHECK(!prompt.empty(), "generation needs a prompt of at least one token");
  model.reset();
  const int64_t n = static_cast<int64_t>(prompt.size());
  const int64_t chunk = cfg.prompt_chunk ? cfg.prompt_chunk : n;
  Tensor logits;
  for (int64_t off = 0; off < n; off += chunk) {
    const int64_t len = std::min(chunk, n - off);
    std::vector<int32_t> part(prompt.begin() + off, prompt.begin() + off + len);
    model.forward(part, std::vector<int32_t>(len, -1), 1, nullptr, &logits);
  }
  Rng rng(cfg.seed);
  std::vector<int32_t> out;
  while (static_cast<int64_t>(out.size()) < cfg.max_new_tokens) {
    const int32_t next = sample_token(logits, logits.dim(0) - 1, cfg.temperature, cfg.top_k, rng);
    out.push_back(next);
    if (on_token) on_token(next);
    if (next == cfg.stop_token || static_cast<int64_t>(out.size()) == cfg.max_new_tokens) break;
    model.forward({next}, {-1}, 1, nullptr, &logits);
  }
  return out;
}

}  // namespace stateflow
