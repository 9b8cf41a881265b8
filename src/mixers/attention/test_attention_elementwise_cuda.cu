// The attention layer's element-wise GPU kernels are ops (mixers/attention/attention_elementwise_op.cpp):
// RoPE, the sigmoid gate and the prefix rows against their float64 references are
// tests/cuda/test_op_defs_cuda.cpp's. Here what the chunked layer relies on beyond that: RoPE
// rotates a token bitwise alike whichever chunk it is in (angles from the global position).
// Skips without a GPU.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cuda/op_buffers.h"
#include "kernels/op_def.h"
#include "test_util.h"

namespace stateflow {
namespace {

using testing::fresh_seed;

TEST(AttentionElementwiseCuda, RopeOfChunksIsBitwiseRopeOfTheSequence) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const OpDef& op = op_named("attention_rope");
  const OpShape whole = op.test_shapes.front().with("batch", 1).with("offset", 0).with("len", 100);
  const int64_t row = whole["heads"] * whole["head_dim"];
  const OpHost host = draw_inputs(op, whole, DType::BF16, seed);
  // Rotates tokens [t0, t1) of the sequence as one call at offset t0; its bytes.
  auto rotated = [&](int64_t t0, int64_t t1) {
    const OpShape chunk = whole.with("offset", t0).with("len", t1 - t0);
    const std::vector<double>& x = host.at("x");
    OpBuffers dev(op, chunk, DType::BF16);
    dev.upload({{"x", std::vector<double>(x.begin() + t0 * row, x.begin() + t1 * row)}});
    for (const char* pass : {"fwd", "bwd", "fwd"}) dev.run(op.pass(pass));
    testing::sync_ok();
    return dev.raw("x");
  };
  std::vector<unsigned char> pieces;
  for (auto [t0, t1] : {std::pair<int64_t, int64_t>{0, 1}, {1, 37}, {37, 64}, {64, 100}}) {
    const std::vector<unsigned char> r = rotated(t0, t1);
    pieces.insert(pieces.end(), r.begin(), r.end());
  }
  EXPECT_TRUE(pieces == rotated(0, 100)) << "a token's rotation depends on how the sequence was cut";
}

}  // namespace
}  // namespace stateflow
