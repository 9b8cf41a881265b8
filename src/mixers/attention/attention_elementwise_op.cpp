// The attention layer's element-wise GPU work (mixers/attention/attention_elementwise_cuda.h)
// as ops (kernels/op_def.h), for their CUDA test and kernels_bench: RoPE at a chunk offset,
// the sigmoid output gate, and a chunk's rows moved into and out of the K/V prefix buffers.
// bf16 storage as the kernels have it; references in float64: rope.h, the gate's formula, the
// row copies. Bench shapes: the bench's heads of 128, fully rotated; the last 2048-token
// chunk's K/V rows in a whole sequence's buffer.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/op_def.h"
#include "mixers/attention/rope.h"

#ifdef STATEFLOW_HAVE_CUDA
#include "kernels/cuda/op_launch.h"
#include "mixers/attention/attention_elementwise_cuda.h"
#endif

namespace stateflow {
namespace {

#ifdef STATEFLOW_HAVE_CUDA
using bf16 = __nv_bfloat16;
#endif

double zero_flops(const OpShape&) { return 0; }  // all memory-bound

// bf16 outputs of fp32 arithmetic on bf16 inputs.
constexpr Tolerance kBf16Out{2e-5, 1e-2};

// ---- RoPE: x rotated in place (an Acc array: read, then overwritten); backward rotates back.
RopeDims rope_of(const OpShape& s) {
  return {s["batch"], s["len"], s["offset"], s["heads"], s["head_dim"], s["rotary_dim"], double(s["theta"])};
}

OpShape rope_shape(int64_t batch, int64_t len, int64_t offset, int64_t heads, int64_t head_dim, int64_t rotary_dim,
                   int64_t theta) {
  return {{{"batch", batch}, {"len", len}, {"offset", offset}, {"heads", heads}, {"head_dim", head_dim},
           {"rotary_dim", rotary_dim}, {"theta", theta}}};
}

OpDef make_rope_op() {
  OpDef op;
  op.name = op.label = "attention_rope";
  op.acts = {DType::BF16};
  // A partial rotation far into a sequence, and a full one at a position past 2^16.
  op.test_shapes = {rope_shape(2, 37, 1000, 3, 128, 64, 10000000), rope_shape(1, 5, 70000, 2, 256, 256, 10000)};
  op.bench_shapes = [](const BenchSizes& b) {
    return std::vector<OpShape>{rope_shape(b.batch, b.tokens, 0, b.heads, 128, 128, 10000)};
  };
  op.bench_label = [](const OpShape& s) { return s.times({"len", "heads", "head_dim"}); };
  op.arrays = [](const OpShape& s) {
    return std::vector<OpArray>{{"x", ArrayType::BF16, s["batch"] * s["len"] * s["heads"] * s["head_dim"], Role::Acc,
                                 Fill::normal(), kBf16Out}};
  };
  // x read and written (bf16).
  auto bytes = [](const OpShape& s) { return 2 * 2.0 * double(s["batch"] * s["len"] * s["heads"] * s["head_dim"]); };
  op.passes = {
      {"fwd", {"x"}, [](const OpShape& s, DType, OpHost& h) { rope_forward<double>(rope_of(s), h.at("x").data()); },
       zero_flops, bytes},
      {"bwd", {"x"}, [](const OpShape& s, DType, OpHost& h) { rope_backward<double>(rope_of(s), h.at("x").data()); },
       zero_flops, bytes}};
#ifdef STATEFLOW_HAVE_CUDA
  op.passes[0].run = [](const OpLaunch& l) { rope_forward_cuda(rope_of(l.shape), l.at<bf16>("x"), nullptr); };
  op.passes[1].run = [](const OpLaunch& l) { rope_backward_cuda(rope_of(l.shape), l.at<bf16>("x"), nullptr); };
#endif
  return op;
}

// ---- sigmoid output gate: y = o s, s = sigmoid(g); do = dy s, dg = dy o s (1 - s)
double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

OpDef make_sigmoid_gate_op() {
  OpDef op;
  op.name = op.label = "attention_sigmoid_gate";
  op.acts = {DType::BF16};
  op.test_shapes = {{{{"n", 1000}}}, {{{"n", 37}}}};
  op.bench_shapes = [](const BenchSizes& b) {
    return std::vector<OpShape>{{{{"n", b.batch * b.tokens * b.heads * 128}}}};
  };
  op.arrays = [](const OpShape& s) {
    const int64_t n = s["n"];
    return std::vector<OpArray>{{"o", ArrayType::BF16, n, Role::In, Fill::normal()},
                                {"g", ArrayType::BF16, n, Role::In, Fill::normal(3.0)},  // saturated gates too
                                {"y", ArrayType::BF16, n, Role::Out, {}, kBf16Out},
                                {"dy", ArrayType::BF16, n, Role::In, Fill::normal()},
                                {"d_o", ArrayType::BF16, n, Role::Out, {}, kBf16Out},
                                {"dg", ArrayType::BF16, n, Role::Out, {}, kBf16Out}};
  };
  op.passes = {{"fwd", {"y"},
                [](const OpShape& s, DType, OpHost& h) {
                  for (int64_t i = 0; i < s["n"]; ++i) h.at("y")[i] = h.at("o")[i] * sigmoid(h.at("g")[i]);
                },
                zero_flops, [](const OpShape& s) { return 3 * 2.0 * s["n"]; }},  // o, g in; y out
               {"bwd", {"d_o", "dg"},
                [](const OpShape& s, DType, OpHost& h) {
                  for (int64_t i = 0; i < s["n"]; ++i) {
                    const double sg = sigmoid(h.at("g")[i]), dy = h.at("dy")[i];
                    h.at("d_o")[i] = dy * sg, h.at("dg")[i] = dy * h.at("o")[i] * sg * (1 - sg);
                  }
                },
                zero_flops, [](const OpShape& s) { return 5 * 2.0 * s["n"]; }}};  // o, g, dy in; d_o, dg out
#ifdef STATEFLOW_HAVE_CUDA
  op.passes[0].run = [](const OpLaunch& l) {
    sigmoid_gate_forward_cuda(l.at<bf16>("o"), l.at<bf16>("g"), l.at<bf16>("y"), l["n"], nullptr);
  };
  op.passes[1].run = [](const OpLaunch& l) {
    sigmoid_gate_backward_cuda(l.at<bf16>("o"), l.at<bf16>("g"), l.at<bf16>("dy"), l.at<bf16>("d_o"),
                               l.at<bf16>("dg"), l["n"], nullptr);
  };
#endif
  return op;
}

// ---- a chunk's rows [offset, offset + len) of the prefix buffers [batch, seq_len, width]:
// "write" copies the chunk's K (or V) in; "take" moves the fp32 gradient's rows out, rounded to
// bf16, and zeroes them. Rows outside the chunk stay as they are: exact copies, compared exactly.
#ifdef STATEFLOW_HAVE_CUDA
PrefixRows rows_of(const OpShape& s) { return {s["batch"], s["seq_len"], s["offset"], s["len"], s["width"]}; }
#endif

OpDef make_prefix_rows_op() {
  OpDef op;
  op.name = op.label = "attention_prefix_rows";
  op.acts = {DType::BF16};
  // Two sequences of 20 rows, rows [7, 12) of width 24; a chunk at the buffer's end.
  op.test_shapes = {{{{"batch", 2}, {"seq_len", 20}, {"offset", 7}, {"len", 5}, {"width", 24}}},
                    {{{"batch", 1}, {"seq_len", 9}, {"offset", 6}, {"len", 3}, {"width", 8}}}};
  op.bench_shapes = [](const BenchSizes& b) {  // the last chunk of 2048 tokens (or the whole of a shorter sequence)
    const int64_t len = std::min<int64_t>(2048, b.tokens);
    return std::vector<OpShape>{{{{"batch", b.batch}, {"seq_len", b.tokens}, {"offset", b.tokens - len}, {"len", len},
                                  {"width", b.heads * 128}}}};
  };
  op.bench_label = [](const OpShape& s) { return s.times({"len", "width"}) + " of " + std::to_string(s["seq_len"]); };
  op.arrays = [](const OpShape& s) {
    const int64_t chunk = s["batch"] * s["len"] * s["width"], whole = s["batch"] * s["seq_len"] * s["width"];
    return std::vector<OpArray>{{"chunk", ArrayType::BF16, chunk, Role::In, Fill::normal()},
                                {"prefix", ArrayType::BF16, whole, Role::Acc, Fill::normal(), kExact},
                                {"dprefix", ArrayType::F32, whole, Role::Acc, Fill::normal(), kExact},
                                {"dchunk", ArrayType::BF16, chunk, Role::Out, {}, kExact}};
  };
  // Calls fn(index in the chunk, index in the buffer) for every element of the chunk's rows.
  auto for_rows = [](const OpShape& s, auto&& fn) {
    const int64_t W = s["width"];
    for (int64_t b = 0; b < s["batch"]; ++b)
      for (int64_t i = 0; i < s["len"]; ++i)
        for (int64_t c = 0; c < W; ++c) fn((b * s["len"] + i) * W + c, (b * s["seq_len"] + s["offset"] + i) * W + c);
  };
  auto chunk = [](const OpShape& s) { return double(s["batch"] * s["len"] * s["width"]); };
  op.passes = {{"write", {"prefix"},
                [for_rows](const OpShape& s, DType, OpHost& h) {
                  for_rows(s, [&](int64_t k, int64_t at) { h.at("prefix")[at] = h.at("chunk")[k]; });
                },
                zero_flops, [chunk](const OpShape& s) { return 2 * 2 * chunk(s); }},  // bf16 rows in and out
               {"take", {"dprefix", "dchunk"},
                [for_rows](const OpShape& s, DType, OpHost& h) {
                  for_rows(s, [&](int64_t k, int64_t at) {
                    h.at("dchunk")[k] = round_to_storage(h.at("dprefix")[at], DType::BF16);
                    h.at("dprefix")[at] = 0;
                  });
                },
                // fp32 rows read and zeroed, bf16 rows written.
                zero_flops, [chunk](const OpShape& s) { return (4 + 4 + 2) * chunk(s); }}};
#ifdef STATEFLOW_HAVE_CUDA
  op.passes[0].run = [](const OpLaunch& l) {
    write_prefix_rows_cuda(rows_of(l.shape),
                           l.at<bf16>("chunk"), l.at<bf16>("prefix"), nullptr);
  };
  op.passes[1].run = [](const OpLaunch& l) {
    take_prefix_rows_cuda(rows_of(l.shape),
                          l.at<float>("dprefix"), l.at<bf16>("dchunk"), nullptr);
  };
#endif
  return op;
}

const OpRegistration rope(make_rope_op());
const OpRegistration sigmoid_gate(make_sigmoid_gate_op());
const OpRegistration prefix_rows(make_prefix_rows_op());

}  // namespace
}  // namespace stateflow
