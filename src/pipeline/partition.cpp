#include "pipeline/partition.h"

#include "core/error.h"
#include "model/model.h"

namespace stateflow {

static std::vector<int64_t> blocks_per_stage(const ModelConfig& cfg, int P) {
  std::vector<int64_t> out;
  if (cfg.stage_pattern.empty()) {
    for (int r = 0; r < P; ++r) out.push_back(cfg.n_layers / P + (r < cfg.n_layers % P ? 1 : 0));
    return out;
  }
  int64_t count = 0;
  for (char ch : cfg.stage_pattern + "|") {
    if (ch == '|') {
      SF_CHECK(count > 0, "stage_pattern '", cfg.stage_pattern, "' has an empty stage; every stage needs a block");
      out.push_back(count);
      count = 0;
    } else {
      SF_CHECK(ch == 'G', "stage_pattern '", cfg.stage_pattern, "': unknown block '", ch,
               "'; use G for a GDN block and | between stages");
      ++count;
    }
  }
  int64_t total = 0;
  for (int64_t b : out) total += b;
  SF_CHECK(total == cfg.n_layers, "stage_pattern '", cfg.stage_pattern, "' has ", total, " blocks but n_layers is ",
           cfg.n_layers);
  SF_CHECK(int(out.size()) == P, "stage_pattern '", cfg.stage_pattern, "' cuts the model into ", out.size(),
           " stages but --stages is ", P);
  return out;
}

std::vector<std::pair<int, int>> stage_layer_ranges(const ModelConfig& cfg, int P) {
  SF_CHECK(P >= 1, "--stages must be at least 1, got ", P);
  SF_CHECK(P <= cfg.n_layers, "--stages ", P, " is more than the model's ", cfg.n_layers,
           " GDN blocks; use at most ", cfg.n_layers, " stages (or a model with more n_layers)");
  const std::vector<int64_t> blocks = blocks_per_stage(cfg, P);
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

}  // namespace stateflow
