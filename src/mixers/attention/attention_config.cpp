#include "mixers/attention/attention_config.h"

#include <cmath>

#include "core/error.h"
#include "model/mixer.h"

namespace stateflow {

void AttentionConfig::validate() const {
  SF_CHECK(heads >= 1 && kv_heads >= 1 && head_dim >= 1, "attention: heads = ", heads, ", kv_heads = ", kv_heads,
           " and head_dim = ", head_dim, " must all be >= 1");
  SF_CHECK(heads % kv_heads == 0, "attention.kv_heads = ", kv_heads, " must divide attention.heads = ", heads,
           " (each K/V head serves heads/kv_heads query heads)");
  SF_CHECK(rotary_dim == 0 || (rotary_dim >= 2 && rotary_dim % 2 == 0 && rotary_dim <= head_dim),
           "attention.rotary_dim = ", rotary_dim, " must be 0 (all of head_dim) or even and in 2..head_dim = ",
           head_dim);
}

int64_t AttentionConfig::num_parameters(int64_t d_model) const {
  const int64_t q = heads * head_dim, kv = kv_heads * head_dim;
  // Wq, Wk, Wv, the output gate Wg, the QK-norm weights, Wo.
  return d_model * (q + 2 * kv) + (output_gate ? d_model * q : 0) + (qk_norm ? 2 * head_dim : 0) + q * d_model;
}

AttentionConfig attention_config(const ModelConfig& cfg) {
  const char* s = "attention";
  AttentionConfig a{section_int(cfg, s, "heads", 1, 1024),       section_int(cfg, s, "kv_heads", 1, 1024),
                    section_int(cfg, s, "head_dim", 1, 1024),    section_int(cfg, s, "rotary_dim", 0, 1024),
                    section_number(cfg, s, "rope_theta", 1.0 + 1e-9, 1e12), section_flag(cfg, s, "qk_norm"),
                    section_flag(cfg, s, "output_gate"),         section_number(cfg, s, "norm_eps", 1e-12, 0.1)};
  a.validate();
  return a;
}

}  // namespace stateflow
