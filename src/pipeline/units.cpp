#include "pipeline/units.h"

#include "pipeline/chunking.h"

namespace stateflow {

UnitPlan::UnitPlan(const Batch& batch, int microbatches, std::vector<int64_t> chunk_lengths)
    : batch_(batch), M_(microbatches), lengths_(std::move(chunk_lengths)) {
  SF_CHECK(M_ >= 1 && batch.batch % M_ == 0, "a batch of ", batch.batch, " sequences cannot be split into ", M_,
           " microbatches: use a --microbatches that divides --batch");
  validate_chunk_lengths(lengths_, batch.seq_len);
  int64_t off = 0;
  for (int64_t l : lengths_) offsets_.push_back(off), off += l;
  int64_t counted = batch.global_loss_tokens;
  if (!counted)
    for (int32_t t : batch.targets) counted += t >= 0;
  loss_scale_ = counted ? 1.0 / double(counted) : 0.0;
}

Unit UnitPlan::make_unit(int m, int c, LossStats* stats) const {
  const int64_t b = batch_.batch / M_, len = lengths_.at(c), off = offsets_.at(c), T = batch_.seq_len;
  Unit u;
  u.ctx.microbatch = m;
  u.ctx.chunk = c;
  u.ctx.offset = off;
  u.ctx.len = len;
  u.ctx.seq_len = T;
  u.ctx.batch = b;
  u.ctx.num_chunks = chunks();
  u.tokens = Tensor::zeros({b * len}, DType::I32, MemCategory::Activations);
  u.ctx.targets = Tensor::zeros({b * len}, DType::I32, MemCategory::Activations);
  int32_t* tok = u.tokens.data<int32_t>();
  int32_t* tgt = u.ctx.targets.data<int32_t>();
  for (int64_t s = 0; s < b; ++s) {
    const int64_t src = (int64_t(m) * b + s) * T + off;
    for (int64_t t = 0; t < len; ++t) {
      tok[s * len + t] = batch_.tokens[src + t];
      tgt[s * len + t] = batch_.targets[src + t];
    }
  }
  u.ctx.loss_scale = loss_scale_;
  u.ctx.stats = stats;
  return u;
}

}  // namespace stateflow
