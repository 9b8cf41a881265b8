// The causal short convolution (kernel K, a carried prefix of K - 1 inputs) as an op
// (kernels/op_def.h), for its CUDA test and kernels_bench. Test shapes: with and without a
// prefix and a prefix gradient, a chunk shorter than K - 1, several row tiles and blocks of
// channels, K from 1 to 8. Reference: kernels/cpu/short_conv.
#include "kernels/cpu/short_conv.h"
#include "kernels/op_def.h"

#ifdef STATEFLOW_HAVE_CUDA
#include "kernels/cuda/op_launch.h"
#include "kernels/cuda/short_conv_cuda.h"
#endif

namespace stateflow {
namespace {

// prefix / dprefix: 1 when the call gets an incoming prefix / an outgoing prefix gradient.
OpShape conv_shape(int64_t batch, int64_t len, int64_t ch, int64_t K, int64_t prefix, int64_t dprefix) {
  return {{{"batch", batch}, {"len", len}, {"ch", ch}, {"K", K}, {"prefix", prefix}, {"dprefix", dprefix}}};
}

double elems(const OpShape& s) { return double(s["batch"] * s["len"] * s["ch"]); }
double* at(OpHost& h, const char* name) { return h.at(name).data(); }

OpDef make_short_conv_op() {
  OpDef op;
  op.name = op.label = "short_conv";
  op.test_shapes = {conv_shape(2, 37, 24, 4, 1, 1), conv_shape(2, 37, 24, 4, 0, 0), conv_shape(1, 2, 16, 4, 1, 1),
                    conv_shape(3, 300, 1032, 3, 1, 1), conv_shape(1, 50, 8, 1, 0, 0), conv_shape(2, 9, 8, 8, 1, 1)};
  op.bench_shapes = [](const BenchSizes& b) {
    return std::vector<OpShape>{conv_shape(1, b.tokens, b.dim, b.conv, 1, 1)};
  };
  op.bench_label = [](const OpShape& s) { return s.times({"len", "ch"}) + ", K " + std::to_string(s["K"]); };
  op.arrays = [](const OpShape& s) {
    const int64_t n = int64_t(elems(s)), np = s["batch"] * (s["K"] - 1) * s["ch"], nw = s["ch"] * s["K"];
    return std::vector<OpArray>{{"x", ArrayType::Act, n, Role::In, Fill::normal()},
                                {"prefix", ArrayType::Act, np, Role::In, Fill::normal()},
                                {"w", ArrayType::F32, nw, Role::In, Fill::normal(0.5)},
                                {"y", ArrayType::Act, n, Role::Out},
                                {"prefix_out", ArrayType::Act, np, Role::Out, {}, kExact},  // a copy of inputs
                                {"dy", ArrayType::Act, n, Role::In, Fill::normal()},
                                {"dprefix_out", ArrayType::F32, np, Role::In, Fill::normal()},
                                {"dx", ArrayType::Act, n, Role::Out},
                                {"dprefix_in", ArrayType::F32, np, Role::Out, {}, kFp32Math},
                                {"dw", ArrayType::F32, nw, Role::Acc, Fill::normal(), kFp32Math}};
  };
  auto zero = [](const OpShape&) { return 0.0; };
  op.passes = {
      {"fwd", {"y", "prefix_out"},
       [](const OpShape& s, DType, OpHost& h) {
         short_conv_forward<double>(at(h, "x"), s["prefix"] ? at(h, "prefix") : nullptr, at(h, "w"), at(h, "y"),
                                    at(h, "prefix_out"), s["batch"], s["len"], s["ch"], s["K"]);
       },
       zero, [](const OpShape& s) { return 2 * 2 * elems(s); }},  // x in, y out (bf16); prefixes, w left out
      {"bwd", {"dx", "dprefix_in", "dw"},
       [](const OpShape& s, DType, OpHost& h) {
         short_conv_backward<double>(at(h, "x"), s["prefix"] ? at(h, "prefix") : nullptr, at(h, "w"), at(h, "dy"),
                                     s["dprefix"] ? at(h, "dprefix_out") : nullptr, at(h, "dx"), at(h, "dprefix_in"),
                                     at(h, "dw"), s["batch"], s["len"], s["ch"], s["K"]);
       },
       zero, [](const OpShape& s) { return 2 * 3 * elems(s); }}};  // x, dy in; dx out
#ifdef STATEFLOW_HAVE_CUDA
  op.workspace_bytes = [](const OpShape& s) {
    return short_conv_backward_workspace_bytes(s["batch"], s["len"], s["ch"], s["K"]);
  };
  op.passes[0].run = [](const OpLaunch& l) {
    dispatch_act(l.act, [&](auto a) {
      using A = decltype(a);
      short_conv_forward_cuda<A>(l.at<A>("x"), l["prefix"] ? l.at<A>("prefix") : nullptr, l.at<float>("w"),
                                 l.at<A>("y"), l.at<A>("prefix_out"), l["batch"], l["len"], l["ch"], l["K"], nullptr);
    });
  };
  op.passes[1].run = [](const OpLaunch& l) {
    dispatch_act(l.act, [&](auto a) {
      using A = decltype(a);
      short_conv_backward_cuda<A>(l.at<A>("x"), l["prefix"] ? l.at<A>("prefix") : nullptr, l.at<float>("w"),
                                  l.at<A>("dy"), l["dprefix"] ? l.at<float>("dprefix_out") : nullptr, l.at<A>("dx"),
                                  l.at<float>("dprefix_in"), l.at<float>("dw"), l["batch"], l["len"], l["ch"], l["K"],
                                  l.workspace, nullptr);
    });
  };
#endif
  return op;
}

const OpRegistration registered(make_short_conv_op());

}  // namespace
}  // namespace stateflow
