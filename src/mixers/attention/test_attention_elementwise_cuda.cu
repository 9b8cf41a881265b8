// The attention layer's element-wise GPU kernels against the CPU: RoPE (rope.h, float64) at a
// chunk offset, forward and backward; the sigmoid gate against its formula; the prefix rows
// written and taken out exactly. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "mixers/attention/attention_elementwise_cuda.h"
#include "mixers/attention/rope.h"
#include "test_util.h"

namespace stateflow {
namespace {

using testing::bf16;
using testing::Dev;
using testing::fresh_seed;
using testing::normal_vec;
using testing::rel_err;
using testing::rounded;
using testing::Vec;

TEST(AttentionElementwiseCuda, RopeMatchesTheCpuAtAChunkOffsetBothWays) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (const RopeDims d : {RopeDims{2, 37, 1000, 3, 128, 64, 1e7}, RopeDims{1, 5, 70000, 2, 256, 256, 1e4}}) {
    const Vec x = rounded<bf16>(normal_vec(rng, size_t(d.batch * d.len * d.heads * d.head_dim)));
    Dev<bf16> dx(x);
    rope_forward_cuda(d, dx.p, nullptr);
    Vec ref = x;
    rope_forward<double>(d, ref.data());
    EXPECT_LE(rel_err(dx.get(), ref), 1e-2);
    dx.upload(x);
    rope_backward_cuda(d, dx.p, nullptr);
    ref = x;
    rope_backward<double>(d, ref.data());
    EXPECT_LE(rel_err(dx.get(), ref), 1e-2);
  }
}

TEST(AttentionElementwiseCuda, SigmoidGateForwardAndBackward) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const size_t n = 1000;
  const Vec o = rounded<bf16>(normal_vec(rng, n)), g = rounded<bf16>(normal_vec(rng, n, 3.0)),
            dy = rounded<bf16>(normal_vec(rng, n));
  Dev<bf16> d_o(o), d_g(g), d_dy(dy), y(n), dout(n), dg(n);
  sigmoid_gate_forward_cuda(d_o.p, d_g.p, y.p, int64_t(n), nullptr);
  sigmoid_gate_backward_cuda(d_o.p, d_g.p, d_dy.p, dout.p, dg.p, int64_t(n), nullptr);
  Vec y_ref(n), do_ref(n), dg_ref(n);
  for (size_t i = 0; i < n; ++i) {
    const double s = 1 / (1 + std::exp(-g[i]));
    y_ref[i] = o[i] * s, do_ref[i] = dy[i] * s, dg_ref[i] = dy[i] * o[i] * s * (1 - s);
  }
  EXPECT_LE(rel_err(y.get(), y_ref), 1e-2);
  EXPECT_LE(rel_err(dout.get(), do_ref), 1e-2);
  EXPECT_LE(rel_err(dg.get(), dg_ref), 1e-2);
}

TEST(AttentionElementwiseCuda, PrefixRowsGoInAndComeOutExactly) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const PrefixRows r{2, 20, 7, 5, 24};  // 2 sequences of 20 rows; rows [7, 12) of width 24
  const Vec chunk = rounded<bf16>(normal_vec(rng, size_t(r.batch * r.len * r.width)));
  const Vec before = rounded<bf16>(normal_vec(rng, size_t(r.batch * r.seq_len * r.width)));
  Dev<bf16> t(chunk), buf(before);
  write_prefix_rows_cuda(r, t.p, buf.p, nullptr);
  const Vec after = buf.get();
  const Vec grad = rounded<bf16>(after);  // bf16 values, exact in fp32 too
  Dev<float> gbuf(grad);
  Dev<bf16> out(chunk.size());
  take_prefix_rows_cuda(r, gbuf.p, out.p, nullptr);
  const Vec taken = out.get(), left = gbuf.get();
  for (int64_t b = 0; b < r.batch; ++b)
    for (int64_t j = 0; j < r.seq_len; ++j)
      for (int64_t c = 0; c < r.width; ++c) {
        const size_t at = size_t((b * r.seq_len + j) * r.width + c);
        const bool mine = j >= r.offset && j < r.offset + r.len;
        const size_t in_chunk = size_t((b * r.len + (j - r.offset)) * r.width + c);
        ASSERT_EQ(after[at], mine ? chunk[in_chunk] : before[at]) << "row " << j;
        ASSERT_EQ(left[at], mine ? 0.0 : grad[at]) << "row " << j;
        if (mine) ASSERT_EQ(taken[in_chunk], chunk[in_chunk]);
      }
}

}  // namespace
}  // namespace stateflow
