// One step's token ids and targets, as the pipeline engine takes them (train/data.h makes them).
#pragma once
#include <cstdint>
#include <vector>

namespace stateflow {

// tokens and targets are [batch * seq_len], row-major. targets[i] is the token that should
// follow position i, or -1 where no loss is taken.
struct Batch {
  int64_t batch = 0, seq_len = 0;
  std::vector<int32_t> tokens, targets;
  // Loss tokens (targets >= 0) of the global batch this one is a data-parallel replica's
  // slice of, which the mean loss divides by; 0: this batch is the whole step.
  int64_t global_loss_tokens = 0;
};

// Data parallelism: replica r of D takes rows [r*B/D, (r+1)*B/D) of the global batch of B
// rows, so the samples of a step do not depend on D (a run resumes under another D).
Batch replica_slice(const Batch& global, int replica, int replicas);

}  // namespace stateflow
