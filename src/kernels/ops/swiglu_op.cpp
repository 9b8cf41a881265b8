// SwiGLU (h = silu(a) b) as an op (kernels/op_def.h), for its CUDA test and kernels_bench.
// Test sizes leave a tail past the kernel's 8-wide vectors. Reference: kernels/cpu/swiglu.
#include "kernels/cpu/swiglu.h"
#include "kernels/op_def.h"

#ifdef STATEFLOW_HAVE_CUDA
#include "kernels/cuda/op_launch.h"
#include "kernels/cuda/swiglu_cuda.h"
#endif

namespace stateflow {
namespace {

double elems(const OpShape& s) { return double(s["rows"] * s["width"]); }

OpDef make_swiglu_op() {
  OpDef op;
  op.name = op.label = "swiglu";
  op.test_shapes = {{{{"rows", 1}, {"width", 7}}}, {{{"rows", 7}, {"width", 14286}}}};  // 7 and 100002 elements
  op.bench_shapes = [](const BenchSizes& b) { return std::vector<OpShape>{{{{"rows", b.tokens}, {"width", b.mlp_hidden}}}}; };
  op.bench_label = [](const OpShape& s) { return s.times({"rows", "width"}); };
  op.arrays = [](const OpShape& s) {
    const int64_t n = s["rows"] * s["width"];
    return std::vector<OpArray>{{"a", ArrayType::Act, n, Role::In, Fill::normal(3.0)},
                                {"b", ArrayType::Act, n, Role::In, Fill::normal()},
                                {"h", ArrayType::Act, n, Role::Out},
                                {"dh", ArrayType::Act, n, Role::In, Fill::normal()},
                                {"da", ArrayType::Act, n, Role::Out},
                                {"db", ArrayType::Act, n, Role::Out}};
  };
  auto zero = [](const OpShape&) { return 0.0; };
  op.passes = {{"fwd", {"h"},
                [](const OpShape& s, DType, OpHost& h) {
                  swiglu_forward<double>(h.at("a").data(), h.at("b").data(), h.at("h").data(), int64_t(elems(s)));
                },
                zero, [](const OpShape& s) { return 2 * 3 * elems(s); }},  // a, b in; h out (bf16)
               {"bwd", {"da", "db"},
                [](const OpShape& s, DType, OpHost& h) {
                  swiglu_backward<double>(h.at("a").data(), h.at("b").data(), h.at("dh").data(), h.at("da").data(),
                                          h.at("db").data(), int64_t(elems(s)));
                },
                zero, [](const OpShape& s) { return 2 * 5 * elems(s); }}};  // a, b, dh in; da, db out
#ifdef STATEFLOW_HAVE_CUDA
  op.passes[0].run = [](const OpLaunch& l) {
    dispatch_act(l.act, [&](auto a) {
      using A = decltype(a);
      swiglu_forward_cuda<A>(l.at<A>("a"), l.at<A>("b"), l.at<A>("h"), l["rows"] * l["width"], nullptr);
    });
  };
  op.passes[1].run = [](const OpLaunch& l) {
    dispatch_act(l.act, [&](auto a) {
      using A = decltype(a);
      swiglu_backward_cuda<A>(l.at<A>("a"), l.at<A>("b"), l.at<A>("dh"), l.at<A>("da"), l.at<A>("db"),
                              l["rows"] * l["width"], nullptr);
    });
  };
#endif
  return op;
}

const OpRegistration registered(make_swiglu_op());

}  // namespace
}  // namespace stateflow
