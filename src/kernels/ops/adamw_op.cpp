// AdamW's update of one fp32 tensor, with the bf16 copy of the updated weights, as an op
// (kernels/op_def.h), for its CUDA test and kernels_bench. Reference: kernels/cpu/adamw on
// float, which the kernel reproduces bitwise (so every array's tolerance is exact).
#include "kernels/cpu/adamw.h"
#include "kernels/op_def.h"

#ifdef STATEFLOW_HAVE_CUDA
#include "kernels/cuda/adamw_cuda.h"
#include "kernels/cuda/op_launch.h"
#endif

namespace stateflow {
namespace {

constexpr double kLr = 1e-4, kDecay = 0.1;

OpDef make_adamw_op() {
  OpDef op;
  op.name = "adamw";
  op.label = "adamw";
  op.acts = {DType::F32};  // master weights and moments are fp32 whatever the activations
  // 67'589 = one pass of the kernel's grid and a tail; step 3 exercises the bias corrections.
  op.test_shapes = {{{{"n", 1000}, {"step", 1}}}, {{{"n", 67589}, {"step", 3}}}};
  op.bench_shapes = [](const BenchSizes&) { return std::vector<OpShape>{{{{"n", int64_t(64) << 20}, {"step", 1}}}}; };
  op.bench_label = [](const OpShape& s) { return std::to_string(s["n"] >> 20) + " M params"; };
  op.arrays = [](const OpShape& s) {
    const int64_t n = s["n"];
    return std::vector<OpArray>{{"p", ArrayType::F32, n, Role::Acc, Fill::normal(), kExact},
                                {"grad", ArrayType::F32, n, Role::In, Fill::normal(1e-3)},
                                {"m", ArrayType::F32, n, Role::Acc, Fill::normal(1e-3), kExact},
                                {"v", ArrayType::F32, n, Role::Acc, Fill::uniform(0, 1e-6), kExact},
                                {"p_bf16", ArrayType::BF16, n, Role::Out, {}, kExact}};
  };
  op.passes = {{"step (+ bf16 copy)", {"p", "m", "v", "p_bf16"},
                [](const OpShape& s, DType, OpHost& h) {
                  const int64_t n = s["n"];
                  std::vector<float> p(h.at("p").begin(), h.at("p").end()), g(h.at("grad").begin(), h.at("grad").end());
                  std::vector<float> m(h.at("m").begin(), h.at("m").end()), v(h.at("v").begin(), h.at("v").end());
                  adamw_update<float>(p.data(), g.data(), m.data(), v.data(), n, kLr, kDecay, AdamWConfig{}, s["step"]);
                  for (int64_t i = 0; i < n; ++i)
                    h.at("p")[i] = p[i], h.at("m")[i] = m[i], h.at("v")[i] = v[i],
                    h.at("p_bf16")[i] = round_to_storage(p[i], DType::BF16);
                },
                [](const OpShape&) { return 0.0; },
                // p, m, v read and written, grad read (fp32), the bf16 copy written.
                [](const OpShape& s) { return 30.0 * double(s["n"]); }}};
#ifdef STATEFLOW_HAVE_CUDA
  op.passes[0].run = [](const OpLaunch& l) {
    adamw_update_cuda(l.at<float>("p"), l.at<float>("grad"), l.at<float>("m"), l.at<float>("v"), l["n"], kLr, kDecay,
                      AdamWConfig{}, l["step"], l.at<__nv_bfloat16>("p_bf16"), nullptr);
  };
#endif
  return op;
}

const OpRegistration registered(make_adamw_op());

}  // namespace
}  // namespace stateflow
