// The dense layer's GEMMs as an op (kernels/op_def.h), for their CUDA test and kernels_bench:
// y = x W, dx += dy W^T (cuBLASLt, pinned algorithms), dW += x^T dy in fixed token steps
// (weight_grad_cuda, last step first), and the same dW as one cuBLAS call, the baseline the
// steps are measured against. Reference: kernels/cpu/gemm in float64.
#include "kernels/cpu/gemm.h"
#include "kernels/op_def.h"

#ifdef STATEFLOW_HAVE_CUDA
#include "kernels/cuda/gemm_cuda.h"
#include "kernels/cuda/op_launch.h"
#include "kernels/cuda/weight_grad_cuda.h"
#endif

namespace stateflow {
namespace {

// step: the weight gradient's token step (kWeightGradTokens in the layers).
OpShape gemm_shape(int64_t rows, int64_t in, int64_t out) {
  return {{{"rows", rows}, {"in", in}, {"out", out}, {"step", 2048}}};
}

double rows(const OpShape& s) { return double(s["rows"]); }
double flops(const OpShape& s) { return 2 * rows(s) * double(s["in"]) * double(s["out"]); }
// x, W, y (or dy, W, dx) once each, bf16.
double operand_bytes(const OpShape& s) {
  return 2 * (rows(s) * double(s["in"]) + double(s["in"] * s["out"]) + rows(s) * double(s["out"]));
}
// x and dy read once (bf16), dW (fp32) read and written once per call or per step.
double weight_grad_bytes(const OpShape& s, double dW_passes) {
  return 2 * rows(s) * double(s["in"] + s["out"]) + 8.0 * double(s["in"] * s["out"]) * dW_passes;
}

void reference_weight_grad(const OpShape& s, DType, OpHost& h) {
  linear_backward_weight<double>(h.at("x").data(), h.at("dy").data(), h.at("dW").data(), s["rows"], s["in"], s["out"]);
}

OpDef make_linear_op() {
  OpDef op;
  op.name = "linear";
  op.label = "gemm";
  // 4196 rows = two whole 2048-token weight-gradient steps and a short one.
  op.test_shapes = {gemm_shape(150, 96, 40), gemm_shape(4196, 64, 48)};
  op.bench_shapes = [](const BenchSizes& b) {
    std::vector<OpShape> s;
    for (auto [in, out] : {std::pair{b.dim, b.dim}, {b.dim, b.mlp_hidden}, {b.mlp_hidden, b.dim}})
      for (int64_t r : {b.tokens / 4, b.tokens / 2, b.tokens})
        if (r >= 1) s.push_back(gemm_shape(r, in, out));
    return s;
  };
  op.bench_label = [](const OpShape& s) { return s.times({"rows", "in", "out"}); };
  op.arrays = [](const OpShape& s) {
    const int64_t r = s["rows"], in = s["in"], out = s["out"];
    return std::vector<OpArray>{{"x", ArrayType::Act, r * in, Role::In, Fill::normal()},
                                {"W", ArrayType::Act, in * out, Role::In, Fill::normal(0.02)},
                                {"y", ArrayType::Act, r * out, Role::Out},
                                {"dy", ArrayType::Act, r * out, Role::In, Fill::normal()},
                                {"dx", ArrayType::Act, r * in, Role::Acc, Fill::normal()},
                                {"dW", ArrayType::F32, in * out, Role::Acc, Fill::normal()}};
  };
  op.passes = {
      {"fwd  y = x W (bf16 out)", {"y"},
       [](const OpShape& s, DType, OpHost& h) {
         linear_forward<double>(h.at("x").data(), h.at("W").data(), h.at("y").data(), s["rows"], s["in"], s["out"]);
       },
       flops, operand_bytes},
      {"bwd  dx += dy W^T (bf16)", {"dx"},
       [](const OpShape& s, DType, OpHost& h) {
         linear_backward_data<double>(h.at("dy").data(), h.at("W").data(), h.at("dx").data(), s["rows"], s["in"],
                                      s["out"]);
       },
       flops, [](const OpShape& s) { return operand_bytes(s) + 2 * rows(s) * double(s["in"]); }},  // dx read too
      {"bwd  dW += x^T dy (2048-token steps)", {"dW"}, reference_weight_grad, flops,
       [](const OpShape& s) { return weight_grad_bytes(s, double((s["rows"] + s["step"] - 1) / s["step"])); }},
      {"bwd  dW += x^T dy (one call, ref)", {"dW"}, reference_weight_grad, flops,
       [](const OpShape& s) { return weight_grad_bytes(s, 1); }},
  };
  op.passes[3].baseline = true;
#ifdef STATEFLOW_HAVE_CUDA
  op.passes[0].run = [](const OpLaunch& l) {
    dispatch_act(l.act, [&](auto a) {
      using A = decltype(a);
      linear_forward_cuda<A, A>(l.gemm, l.at<A>("x"), l.at<A>("W"), l.at<A>("y"), l["rows"], l["in"], l["out"], 1);
    });
  };
  op.passes[1].run = [](const OpLaunch& l) {
    dispatch_act(l.act, [&](auto a) {
      using A = decltype(a);
      linear_backward_data_cuda<A, A>(l.gemm, l.at<A>("dy"), l.at<A>("W"), l.at<A>("dx"), l["rows"], l["in"],
                                      l["out"], 1);
    });
  };
  op.passes[2].run = [](const OpLaunch& l) {
    dispatch_act(l.act, [&](auto a) {
      using A = decltype(a);
      const int64_t in = l["in"], out = l["out"], r = l["rows"];
      const WeightGradOperands<A> ops{l.at<A>("x"), in, r * in, l.at<A>("dy"), out, r * out};
      weight_grad_cuda<A>(l.gemm, ops, l.at<float>("dW"), 1, r, in, out, l["step"]);
    });
  };
  op.passes[3].run = [](const OpLaunch& l) {
    dispatch_act(l.act, [&](auto a) {
      using A = decltype(a);
      const int64_t in = l["in"], out = l["out"];
      gemm_cuda<A, float>(l.gemm, true, false, in, out, l["rows"], 1.f, l.at<A>("x"), in, l.at<A>("dy"), out, 1.f,
                          l.at<float>("dW"), out);
    });
  };
#endif
  return op;
}

const OpRegistration registered(make_linear_op());

}  // namespace
}  // namespace stateflow
