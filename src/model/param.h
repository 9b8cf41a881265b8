// A trainable parameter: its value and the gradient accumulated over every unit of a step.
#pragma once
#include <string>
#include <vector>

#include "core/tensor.h"

namespace stateflow {

struct Param {
  std::string name;  // e.g. "blocks.3.mixer.Wq": stable, used in checkpoints and reports
  Tensor value;      // MemCategory::Weights
  Tensor grad;       // MemCategory::Grads, same shape
  // GPU mixed precision: a weight that GEMMs read also keeps a bf16 copy there, refreshed
  // from the fp32 value after every optimizer step. Layers set the flag; empty on the CPU.
  bool gemm_operand = false;
  // AdamW decays matrices only (model/optimizer.h); a layer clears this for a tensor that is a
  // bias in table form (e.g. Mamba-3's per-head B/C biases), which the reference leaves undecayed.
  bool weight_decay = true;
  Tensor value_bf16{};  // (braces: aggregate initialisers may leave it out without a warning)
  // Params of one layer with the same bf16_group > 0 (set by the layer) may share one bf16 copy
  // on the GPU, their columns side by side in params() order, so that one GEMM reads them all
  // (share_bf16_copies, model/device_ops.h). Then value_bf16 is the shared [rows, bf16_ld]
  // matrix and this param's copy is its columns from bf16_col; bf16_ld is 0 for a copy of its own.
  int bf16_group = 0;
  int64_t bf16_col = 0, bf16_ld = 0;
};

// Creates value (zeros, filled by the caller) and a zero grad of the same shape on the host;
// on a thread inside a GradsAtPlacement scope the grad is left empty for move_param_to to make.
Param make_param(const std::string& name, const Shape& shape, DType dtype);
// Moves value to device d (fp32 there), adding value_bf16 for a GEMM operand on the GPU, and
// gives p a zero grad there (or an empty one on the host): params move when built, before any
// backward, so no grad is copied.
void move_param_to(Param& p, Device d);

// RAII: make_param on this thread leaves grads empty while the scope lives. A model built for
// the GPU draws its weights on the host but keeps its grads on the device only: made on the
// host too, they would be allocated and zeroed to be thrown away (5.9 GB for gdn-1.3b).
class GradsAtPlacement {
 public:
  GradsAtPlacement();
  ~GradsAtPlacement();
  GradsAtPlacement(const GradsAtPlacement&) = delete;
  GradsAtPlacement& operator=(const GradsAtPlacement&) = delete;

 private:
  bool prev_;
};

}  // namespace stateflow

namespace stateflow {
class Rng;
// Initialisers used by the layers' constructors.
void fill_normal(Tensor& t, Rng& rng, double std);
void fill_constant(Tensor& t, double value);
}  // namespace stateflow
