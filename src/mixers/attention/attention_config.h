// The attention mixer's config section, "attention": {"heads", "kv_heads", "head_dim",
// "rotary_dim", "rope_theta", "qk_norm", "output_gate", "norm_eps"} (docs/attention.md).
#pragma once
#include <cstdint>

#include "model/config.h"

namespace stateflow {

struct AttentionConfig {
  int64_t heads = 4;           // query heads
  int64_t kv_heads = 2;        // K/V heads; divides heads (grouped-query attention)
  int64_t head_dim = 8;        // size of every q, k and v head
  int64_t rotary_dim = 0;      // leading dims of each head that RoPE rotates (even); 0: all of head_dim
  double rope_theta = 10000.0; // RoPE base
  bool qk_norm = true;         // RMSNorm (learned weight per head dim) on q and k before RoPE
  bool output_gate = true;     // o * sigmoid(x Wg) before the output projection
  double norm_eps = 1e-6;      // QK-norm

  int64_t rotary_dims() const { return rotary_dim ? rotary_dim : head_dim; }
  // Bytes of one K/V prefix (K and V) for `batch` sequences of `seq_len` tokens; its gradient
  // is as large again while the microbatch runs backward.
  int64_t kv_prefix_bytes(int64_t batch, int64_t seq_len, int64_t element_bytes) const {
    return batch * seq_len * kv_heads * head_dim * 2 * element_bytes;
  }
  // The rules between fields; throws Error naming the field ("attention.kv_heads = 3 must divide ...").
  void validate() const;
  // Parameters of one mixer with model width d_model.
  int64_t num_parameters(int64_t d_model) const;
};

// The checked section of cfg; throws Error naming the field ("attention.heads = 0 is out of range ...").
AttentionConfig attention_config(const ModelConfig& cfg);

}  // namespace stateflow
