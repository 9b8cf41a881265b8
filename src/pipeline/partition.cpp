#include "pipeline/partition.h"

#include <algorithm>

#include "core/error.h"
#include "model/flops.h"
#include "model/mixer.h"
#include "model/model.h"

namespace stateflow {

// The pattern's explicit cuts: blocks between '|'.
static std::vector<int64_t> blocks_between_cuts(const ModelConfig& cfg, int P) {
  std::vector<int64_t> out{0};
  for (char ch : cfg.pattern) {
    if (ch == '|') out.push_back(0);
    else ++out.back();
  }
  SF_CHECK(int(out.size()) == P, "layer pattern '", cfg.pattern, "' cuts the model into ", out.size(),
           " stages but --stages is ", P, "; change --stages, or give a pattern without '|' to cut evenly by cost");
  return out;
}

// Contiguous runs of blocks with the smallest possible largest cost (forward + backward FLOPs);
// among such cuts, earlier stages take as many blocks as fit, so equal blocks split as n/P with
// the remainder on the first stages.
static std::vector<int64_t> blocks_by_cost(const ModelConfig& cfg, int P) {
  const std::string letters = cfg.blocks();
  const int n = static_cast<int>(letters.size());
  std::vector<double> cost(n);
  for (int i = 0; i < n; ++i) {
    // The cut belongs to the model, not to a run's sequence length: attention's core is weighed
    // at one key per token (a per-run cut from measured costs is issue 15's cost model).
    const BlockFlops f = block_flops_per_token(cfg, letters[i], 1);
    cost[i] = f.forward() + f.backward();
  }
  // fits(limit): can the blocks be cut into at most P runs of cost <= limit, each non-empty?
  auto cut = [&](double limit) {
    std::vector<int64_t> runs;
    int i = 0;
    for (int r = 0; r < P && i < n; ++r) {
      double sum = 0;
      int64_t count = 0;
      // Leave at least one block for every later stage.
      while (i < n && n - i > P - 1 - r && (count == 0 || sum + cost[i] <= limit * (1 + 1e-12))) sum += cost[i++], ++count;
      runs.push_back(count);
    }
    return i == n && int(runs.size()) == P ? runs : std::vector<int64_t>{};
  };
  // The optimal limit is the cost of some contiguous run: try them in increasing order.
  std::vector<double> candidates;
  for (int a = 0; a < n; ++a) {
    double sum = 0;
    for (int b = a; b < n; ++b) candidates.push_back(sum += cost[b]);
  }
  std::sort(candidates.begin(), candidates.end());
  auto first = std::partition_point(candidates.begin(), candidates.end(),
                                    [&](double limit) { return cut(limit).empty(); });
  SF_CHECK(first != candidates.end(), "cannot cut the model's ", n, " blocks into ", P, " stages");
  return cut(*first);
}

std::vector<std::pair<int, int>> stage_layer_ranges(const ModelConfig& cfg, int P) {
  SF_CHECK(P >= 1, "--stages must be at least 1, got ", P);
  cfg.validate();
  const int64_t n_blocks = cfg.num_blocks();
  SF_CHECK(P <= n_blocks, "--stages ", P, " is more than the model's ", n_blocks, " blocks (pattern '", cfg.pattern,
           "'); use at most ", n_blocks, " stages (or a model with more blocks)");
  const std::vector<int64_t> blocks = cfg.has_stage_cuts() ? blocks_between_cuts(cfg, P) : blocks_by_cost(cfg, P);
  const int n = Model::num_layers_of(cfg);
  std::vector<std::pair<int, int>> out;
  int64_t first_block = 0;
  for (int r = 0; r < P; ++r) {
    const int begin = r == 0 ? 0 : static_cast<int>(1 + 2 * first_block);
    first_block += blocks[r];
    const int end = r == P - 1 ? n : static_cast<int>(1 + 2 * first_block);
    out.push_back({begin, end});
  }
  return out;
}

std::vector<std::string> stage_blocks(const ModelConfig& cfg, int P) {
  const std::string letters = cfg.blocks();
  std::vector<std::string> out;
  for (auto [begin, end] : stage_layer_ranges(cfg, P)) {  // layer 2i+1 is block i's mixer
    const int first = std::max(begin - 1, 0) / 2, last = std::min<int>((end - 1) / 2, int(letters.size()));
    out.push_back(letters.substr(size_t(first), size_t(last - first)));
  }
  return out;
}

std::vector<int64_t> stage_parameters(const ModelConfig& cfg, int P) {
  std::vector<int64_t> out;
  const std::vector<std::string> blocks = stage_blocks(cfg, P);
  for (int r = 0; r < P; ++r) {
    int64_t params = (r == 0 ? cfg.vocab_size * cfg.d_model : 0) +
                     (r == P - 1 ? cfg.d_model + cfg.d_model * cfg.vocab_size : 0);
    for (char letter : blocks[size_t(r)])
      params += mixer_for_letter(letter).num_parameters(cfg) + 3 * cfg.d_model * cfg.mlp_hidden + 2 * cfg.d_model;
    out.push_back(params);
  }
  return out;
}

}  // namespace stateflow
