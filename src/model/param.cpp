#include "model/param.h"

namespace stateflow {

static thread_local bool tl_grads_at_placement = false;

GradsAtPlacement::GradsAtPlacement() : prev_(tl_grads_at_placement) { tl_grads_at_placement = true; }
GradsAtPlacement::~GradsAtPlacement() { tl_grads_at_placement = prev_; }

Param make_param(const std::string& name, const Shape& shape, DType dtype) {
  return Param{name, Tensor::zeros(shape, dtype, MemCategory::Weights),
               tl_grads_at_placement ? Tensor() : Tensor::zeros(shape, dtype, MemCategory::Grads)};
}

void move_param_to(Param& p, Device d) {
  const auto make_grad = [&] { p.grad = Tensor::zeros(p.value.shape(), p.value.dtype(), MemCategory::Grads, d); };
  if (p.value.device() == d) {
    if (!p.grad.defined()) make_grad();
    return;
  }
  SF_CHECK(d == Device::CPU || p.value.dtype() == DType::F32, "parameter ", p.name, " is ",
           dtype_name(p.value.dtype()), ": GPU master weights are f32, use --dtype f32 with --device cuda");
  p.value_bf16 = p.gemm_operand && d != Device::CPU ? p.value.cast(DType::BF16).to(d, MemCategory::Weights) : Tensor();
  p.value = p.value.to(d, MemCategory::Weights);
  make_grad();
}

}  // namespace stateflow

#include <algorithm>

#include "core/parallel.h"
#include "core/rng.h"

namespace stateflow {

// A normal costs ~25 ns (libm's log and cos, which fix its value bits), so a big tensor is drawn
// in pieces in parallel: element i takes the stream's draws 2i and 2i + 1 (Rng::normal takes
// two), so the piece from element b on starts from the state advanced by 2b draws, and every
// value is the one a single loop over the stream gives. rng ends past all 2n draws, as there.
void fill_normal(Tensor& t, Rng& rng, double std) {
  constexpr int64_t kPiece = int64_t(1) << 20;  // elements: an advance (~0.2 ms) is lost in a piece
  const int64_t n = t.numel();
  dispatch_float(t.dtype(), [&](auto z) {
    using T = decltype(z);
    T* p = t.data<T>();
    auto draw = [&](Rng& r, int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) p[i] = static_cast<T>(std * r.normal());
    };
    if (n <= kPiece) return draw(rng, 0, n);
    parallel_for((n + kPiece - 1) / kPiece, [&](int64_t piece) {
      Rng r = rng;
      r.advance(2 * uint64_t(piece * kPiece));
      draw(r, piece * kPiece, std::min(n, (piece + 1) * kPiece));
    });
    rng.advance(2 * uint64_t(n));
  });
}

void fill_constant(Tensor& t, double value) {
  dispatch_float(t.dtype(), [&](auto z) {
    using T = decltype(z);
    T* p = t.data<T>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<T>(value);
  });
}

}  // namespace stateflow
