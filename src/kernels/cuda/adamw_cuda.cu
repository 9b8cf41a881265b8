#include "kernels/cuda/adamw_cuda.h"

#include <algorithm>
#include <cmath>

#include "kernels/cuda/cuda_check.h"

namespace stateflow {
namespace {

struct AdamWCoeffs {
  double beta1, one_minus_beta1, beta2, one_minus_beta2, eps, lr, decay_factor, bias1, bias2;
};

// Each intrinsic rounds once, like the CPU's separate double operations: no contraction
// into fused multiply-adds, which would change the last bits.
__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, int64_t n, AdamWCoeffs c,
                             __nv_bfloat16* p_bf16, int64_t bf16_cols, int64_t bf16_ld) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const double gi = g[i];
    const double mi = __dadd_rn(__dmul_rn(c.beta1, m[i]), __dmul_rn(c.one_minus_beta1, gi));
    const double vi = __dadd_rn(__dmul_rn(c.beta2, v[i]), __dmul_rn(__dmul_rn(c.one_minus_beta2, gi), gi));
    const double pi = __dmul_rn(double(p[i]), c.decay_factor);
    const double step = __ddiv_rn(__dmul_rn(c.lr, __ddiv_rn(mi, c.bias1)),
                                  __dadd_rn(__dsqrt_rn(__ddiv_rn(vi, c.bias2)), c.eps));
    const float pn = float(__dsub_rn(pi, step));
    p[i] = pn;
    m[i] = float(mi);
    v[i] = float(vi);
    if (p_bf16) p_bf16[bf16_ld > bf16_cols ? i / bf16_cols * bf16_ld + i % bf16_cols : i] = __float2bfloat16(pn);
  }
}

}  // namespace

void adamw_update_cuda(float* p, const float* g, float* m, float* v, int64_t n, double lr, double decay,
                       const AdamWConfig& cfg, int64_t step, __nv_bfloat16* p_bf16, cudaStream_t stream,
                       int64_t bf16_cols, int64_t bf16_ld) {
  cfg.validate();
  SF_CHECK(lr >= 0 && std::isfinite(lr), "learning rate ", lr, " must be finite and >= 0");
  SF_CHECK(step >= 1, "adamw_update_cuda: step ", step, " must count from 1");
  SF_CHECK(bf16_ld <= bf16_cols || (bf16_cols > 0 && n % bf16_cols == 0), "adamw_update_cuda: a bf16 copy of ",
           bf16_cols, " columns in rows of ", bf16_ld, " does not tile ", n, " values");
  if (n == 0) return;
  // The same host expressions as AdamW::step, so the coefficients are bitwise the CPU's.
  const AdamWCoeffs c{cfg.beta1,
                      1 - cfg.beta1,
                      cfg.beta2,
                      1 - cfg.beta2,
                      cfg.eps,
                      lr,
                      1 - lr * decay,
                      1 - std::pow(cfg.beta1, static_cast<double>(step)),
                      1 - std::pow(cfg.beta2, static_cast<double>(step))};
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 8192);
  adamw_kernel<<<unsigned(blocks), 256, 0, stream>>>(p, g, m, v, n, c, p_bf16, bf16_cols, bf16_ld);
  cuda_check_launch("adamw_kernel");
}

}  // namespace stateflow
