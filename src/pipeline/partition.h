// Which layers each pipeline stage owns. The model's flat layer list is
//   0: embedding | 2 layers per block (mixer, MLP) | last: LM head;
// stage r owns a contiguous range of it: the embedding goes with stage 0, the head with the
// last stage, and the blocks are cut where the layer pattern has '|', or else evenly by cost
// (each block's forward + backward FLOPs per token; equal blocks split n/P, the remainder on
// the first stages).
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "model/config.h"

namespace stateflow {

// [begin, end) of the flat layer list for every stage; throws Error naming the fix when the
// model cannot be cut into `stages` parts (more stages than blocks, a pattern whose cuts disagree).
std::vector<std::pair<int, int>> stage_layer_ranges(const ModelConfig& cfg, int stages);

// The block letters each stage owns, in order (stage_layer_ranges read as blocks).
std::vector<std::string> stage_blocks(const ModelConfig& cfg, int stages);

// The parameters each stage owns (the embedding on the first, the final norm and LM head on the last).
std::vector<int64_t> stage_parameters(const ModelConfig& cfg, int stages);

}  // namespace stateflow
