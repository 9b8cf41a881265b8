#include "pipeline/grad_reduce.h"

#include <set>

namespace stateflow {

std::vector<GradBucket> plan_buckets(const std::vector<std::vector<Param*>>& layer_params, int64_t bucket_bytes) {
  SF_CHECK(bucket_bytes > 0, "the gradient bucket size must be positive, got ", bucket_bytes, " bytes");
  // Each parameter goes with the lowest layer that has it: only its backward makes it final.
  std::set<Param*> seen;
  std::vector<std::vector<Param*>> owned(layer_params.size());
  for (size_t j = 0; j < layer_params.size(); ++j)
    for (Param* p : layer_params[j])
      if (seen.insert(p).second) owned[j].push_back(p);
  std::vector<GradBucket> out;
  for (size_t j = owned.size(); j-- > 0;)
    for (auto it = owned[j].rbegin(); it != owned[j].rend(); ++it) {
      const int64_t bytes = int64_t((*it)->grad.nbytes());
      if (out.empty() || out.back().bytes >= bucket_bytes) out.emplace_back();
      GradBucket& b = out.back();
      b.params.push_back(*it);
      b.lowest_layer = int(j);
      b.bytes += bytes;
    }
  return out;
}

GradientReducer::GradientReducer(const std::vector<std::vector<Param*>>& layer_params, Transport& group, int stage,
                                 int64_t bucket_bytes)
    : buckets_(plan_buckets(layer_params, bucket_bytes)), group_(group), stage_(stage) {}

void GradientReducer::start(size_t bucket) {
  const GradBucket& b = buckets_[bucket];
  std::vector<Tensor> grads;
  for (Param* p : b.params) grads.push_back(p->grad);
  group_.start_all_reduce_sum(grads, cat("gradient bucket ", bucket + 1, " of ", buckets_.size(), " of stage ", stage_,
                                         " (", b.params.front()->name, "..", b.params.back()->name, ")"));
}

void GradientReducer::layer_done(int layer) {
  while (next_ < buckets_.size() && buckets_[next_].lowest_layer >= layer) start(next_++);
}

void GradientReducer::finish() {
  while (next_ < buckets_.size()) start(next_++);
  next_ = 0;
  group_.wait_all_reduces();
}

}  // namespace stateflow
