// Data parallelism: sums one stage's gradients over its D replicas through the stage group's
// transport, bucket by bucket, overlapped with the end of the backward pass.
//
// Buckets are runs of the stage's parameters in backward order (last layer first) of about
// bucket_bytes each; a parameter larger than that is a bucket of its own. A layer's gradients
// are final once the stage's last backward of the step has gone through it, so the stage
// reports each layer of that backward (layer_done) and a bucket starts as soon as its lowest
// layer is done, while the backward goes on through the layers below. Every replica runs the
// same schedule on the same model, so every replica starts the same buckets in the same order:
// the reduction order is fixed by the model and bucket_bytes alone, and a run repeats bit for
// bit.
#pragma once
#include <cstdint>
#include <vector>

#include "model/param.h"
#include "pipeline/transport.h"

namespace stateflow {

constexpr int64_t kDefaultBucketBytes = int64_t(25) << 20;  // large enough to amortise a launch

struct GradBucket {
  std::vector<Param*> params;  // backward order
  int lowest_layer = 0;        // the bucket is final once this layer's last backward is done
  int64_t bytes = 0;
};

// layer_params[j]: the parameters of the stage's layer j (j in model order); a parameter that
// several layers share belongs to the lowest of them.
std::vector<GradBucket> plan_buckets(const std::vector<std::vector<Param*>>& layer_params, int64_t bucket_bytes);

class GradientReducer {
 public:
  // group: this stage's group transport (rank = replica); `stage` names it in errors.
  GradientReducer(const std::vector<std::vector<Param*>>& layer_params, Transport& group, int stage,
                  int64_t bucket_bytes = kDefaultBucketBytes);
  // Layer j's gradients are final: starts every bucket that just became complete.
  void layer_done(int layer);
  // Starts what is left (all of it when no layer was reported), waits for every bucket, and
  // gets ready for the next step.
  void finish();
  const std::vector<GradBucket>& buckets() const { return buckets_; }

 private:
  void start(size_t bucket);
  std::vector<GradBucket> buckets_;
  Transport& group_;
  int stage_;
  size_t next_ = 0;  // first bucket not started this step
};

}  // namespace stateflow
