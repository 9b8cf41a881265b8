// The token embedding (a row copy forward, a scatter-add backward) as an op (kernels/op_def.h),
// for its CUDA test and kernels_bench. Reference: kernels/cpu/embedding; the forward is a copy
// (exact after rounding to the activation type), the backward's fp32 sums in the fp32 band.
#include <cmath>

#include "kernels/cpu/embedding.h"
#include "kernels/op_def.h"

#ifdef STATEFLOW_HAVE_CUDA
#include "kernels/cuda/embedding_cuda.h"
#include "kernels/cuda/op_launch.h"
#endif

namespace stateflow {
namespace {

int64_t rows(const OpShape& s) { return s["batch"] * s["len"]; }

// Table rows a forward reads and a backward writes: the expected number of distinct ids among
// rows uniform draws from the vocabulary, V (1 - (1 - 1/V)^rows).
double distinct_ids(const OpShape& s) {
  const double V = double(s["vocab"]);
  return V * (1 - std::pow(1 - 1 / V, double(rows(s))));
}

std::vector<int32_t> ids_of(const std::vector<double>& v) { return {v.begin(), v.end()}; }

OpDef make_embedding_op() {
  OpDef op;
  op.name = op.label = "embedding";
  // ~18 occurrences per token: the backward's runs of equal ids, across the two sequences.
  op.test_shapes = {{{{"batch", 2}, {"len", 500}, {"dim", 136}, {"vocab", 57}}}};
  op.bench_shapes = [](const BenchSizes& b) {
    return std::vector<OpShape>{{{{"batch", 1}, {"len", b.tokens}, {"dim", b.dim}, {"vocab", b.vocab}}}};
  };
  op.bench_label = [](const OpShape& s) { return s.times({"len", "dim"}) + ", V " + std::to_string(s["vocab"]); };
  op.arrays = [](const OpShape& s) {
    const int64_t n = rows(s) * s["dim"], nt = s["vocab"] * s["dim"];
    return std::vector<OpArray>{{"ids", ArrayType::I32, rows(s), Role::In, Fill::ids(s["vocab"])},
                                {"table", ArrayType::F32, nt, Role::In, Fill::normal()},
                                {"out", ArrayType::Act, n, Role::Out, {}, kExact},
                                {"dout", ArrayType::Act, n, Role::In, Fill::normal()},
                                {"dtable", ArrayType::F32, nt, Role::Acc, Fill::normal(), kFp32Math}};
  };
  auto zero = [](const OpShape&) { return 0.0; };
  op.passes = {
      {"fwd", {"out"},
       [](const OpShape& s, DType act, OpHost& h) {
         embedding_forward<double>(ids_of(h.at("ids")).data(), h.at("table").data(), h.at("out").data(), rows(s),
                                   s["dim"], s["vocab"]);
         for (double& x : h.at("out")) x = round_to_storage(x, act);
       },
       zero,
       // ids in, the rows they name read, out written (bf16).
       [](const OpShape& s) { return 4.0 * rows(s) + 4 * distinct_ids(s) * s["dim"] + 2.0 * rows(s) * s["dim"]; }},
      {"bwd (sort + owned rows)", {"dtable"},
       [](const OpShape& s, DType, OpHost& h) {
         embedding_backward<double>(ids_of(h.at("ids")).data(), h.at("dout").data(), h.at("dtable").data(), rows(s),
                                    s["dim"]);
       },
       zero,
       // ids and dout in, the rows they name read and written.
       [](const OpShape& s) { return 4.0 * rows(s) + 2.0 * rows(s) * s["dim"] + 8 * distinct_ids(s) * s["dim"]; }}};
#ifdef STATEFLOW_HAVE_CUDA
  op.workspace_bytes = [](const OpShape& s) {
    return embedding_backward_workspace_bytes(rows(s));
  };
  op.passes[0].run = [](const OpLaunch& l) {
    dispatch_act(l.act, [&](auto a) {
      using A = decltype(a);
      embedding_forward_cuda<A>(l.at<int32_t>("ids"), l.at<float>("table"), l.at<A>("out"), l["batch"] * l["len"],
                                l["dim"], l["vocab"], nullptr, nullptr);
    });
  };
  op.passes[1].run = [](const OpLaunch& l) {
    dispatch_act(l.act, [&](auto a) {
      using A = decltype(a);
      embedding_backward_cuda<A>(l.at<int32_t>("ids"), l.at<A>("dout"), l.at<float>("dtable"), l["batch"] * l["len"],
                                 l["dim"], l["vocab"], l["batch"], l.workspace, nullptr);
    });
  };
#endif
  return op;
}

const OpRegistration registered(make_embedding_op());

}  // namespace
}  // namespace stateflow
