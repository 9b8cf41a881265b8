// The dependency rule (ARCHITECTURE.md, "The dependency rule"), written once. The checker,
// the lowering pass, the simulator and the engine all ask this file what an action needs.
//
//   F(m,c) on r needs F(m,c) on r-1 (its input) and F(m,c-1) on r (its boundary state).
//   B(m,c) on r needs B(m,c) on r+1 (its output gradient), B(m,c+1) on r (the boundary-state
//   gradient) and F(m,c) on r (its stash).
#pragma once
#include <array>
#include <vector>

#include "pipeline/schedule.h"

namespace stateflow {

// The compute actions one action needs, at most three; iterate with a range-for.
struct Prerequisites {
  std::array<Action, 3> items{};
  int count = 0;
  const Action* begin() const { return items.data(); }
  const Action* end() const { return items.data() + count; }
};

// Prerequisites of a compute action (F or B) in a pipeline of P stages and N chunks.
// A prerequisite on another stage is a message: its output must travel to a.stage.
Prerequisites prerequisites(const Action& a, int P, int N);

// For every compute action of the shape (indexed by compute_index), the stages other than its
// own that need its output, ascending: the messages a lowered schedule carries. Derived from
// prerequisites(), so it follows the rule wherever the rule goes.
std::vector<std::vector<int>> consumer_stages(int P, int M, int N);

}  // namespace stateflow
