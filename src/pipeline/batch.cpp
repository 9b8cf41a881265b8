#include "pipeline/batch.h"

#include "core/error.h"

namespace stateflow {

Batch replica_slice(const Batch& global, int replica, int replicas) {
  SF_CHECK(replicas >= 1 && global.batch % replicas == 0, "a batch of ", global.batch,
           " sequences cannot be shared by ", replicas, " data-parallel replicas: use a --batch that is a multiple of ",
           replicas, " (each replica takes --batch / --data-parallel sequences)");
  SF_CHECK(replica >= 0 && replica < replicas, "replica ", replica, " is not one of ", replicas);
  const int64_t rows = global.batch / replicas, first = replica * rows, T = global.seq_len;
  Batch out{rows, T, {}, {}, 0};
  out.tokens.assign(global.tokens.begin() + first * T, global.tokens.begin() + (first + rows) * T);
  out.targets.assign(global.targets.begin() + first * T, global.targets.begin() + (first + rows) * T);
  for (int32_t t : global.targets) out.global_loss_tokens += t >= 0;
  return out;
}

}  // namespace stateflow
