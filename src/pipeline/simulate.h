// The simulator: runs an (unlowered) schedule against a table of per-action costs and bytes.
// Each stage runs its list in order; an action starts when its stage is free and every
// prerequisite (dependency.h) has finished, plus the message time for one on another stage.
// Stages that share one device (CostTable::shared_device) also wait for it: one action at a
// time over all stages, the one that can start first going first.
// It answers "what would this shape do" from costs measured elsewhere, and is what a
// chunk-length search evaluates.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "core/allocator.h"
#include "pipeline/schedule.h"
#include "pipeline/trace.h"

namespace stateflow {

using ByteCounts = std::array<int64_t, kNumMemCategories>;  // indexed by MemCategory

struct CostTable {
  std::vector<std::vector<double>> forward_time;   // [stage][chunk]: chunk lengths may differ
  std::vector<std::vector<double>> backward_time;  // [stage][chunk]
  // [stage][chunk]: bytes a unit holds from the start of its F to the end of its B (stash,
  // boundary states...); empty: none.
  std::vector<std::vector<ByteCounts>> unit_bytes;
  std::vector<ByteCounts> resident_bytes;  // [stage]: weights, grads, optimizer...; empty: none
  std::vector<double> send_time;           // [chunk]: time of one message between stages; empty: 0
  // [stage]: bytes of one microbatch's K/V prefixes (every attention layer of the stage, in
  // MemCategory::KvPrefix), held from its chunk 0 forward to the end of its chunk 0 backward,
  // and of their gradients, held from its last chunk's backward to the same end; empty: none.
  std::vector<int64_t> kv_prefix_bytes, kv_grad_bytes;
  // [stage][chunk]: transient working memory of a unit's forward and backward (its largest
  // layer's scratch), on top of what the stage holds while it runs, its unit's stash included;
  // in MemCategory::Other. Empty: none.
  std::vector<std::vector<int64_t>> forward_work_bytes, backward_work_bytes;
  // Every stage on one device (e.g. --transport local on one GPU): its work is serialised, so an
  // action also waits until the device is free.
  bool shared_device = false;
};

// Every stage and chunk alike: forward/backward time per unit and activation bytes per unit.
CostTable uniform_costs(int P, int N, double forward, double backward, int64_t activation_bytes = 0);

struct SimResult {
  double makespan = 0;
  std::vector<double> busy;               // [stage]: time spent in F and B
  double bubble_fraction = 0;             // 1 - sum(busy) / (P * makespan)
  std::vector<ByteCounts> peak_bytes;     // [stage]: peak of each category
  std::vector<int64_t> peak_total_bytes;  // [stage]: peak of the sum over categories
  std::vector<int> peak_in_flight;        // [stage]: units forwarded but not yet backwarded
  std::vector<TimedAction> timeline;      // every F and B, by start time then stage
};

// Throws Error if the schedule is lowered (messages are modelled by send_time), if the table
// does not fit its shape, or if it does not run (with the checker's grid).
SimResult simulate(const Schedule& s, const CostTable& costs);

}  // namespace stateflow
