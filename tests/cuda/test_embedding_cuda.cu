// Embedding on the GPU against kernels/cpu/embedding: forward copies rows exactly; backward
// (many repeated tokens) is bitwise the CPU float kernel for fp32 gradients (same order of
// additions) and in the bf16 band otherwise; repeated backward runs are bitwise equal; bad
// token ids are flagged.
#include <gtest/gtest.h>

#include "kernels/cpu/embedding.h"
#include "kernels/cuda/embedding_cuda.h"
#include "cuda_test_util.h"
#include "test_util.h"

namespace stateflow {
namespace {

using namespace testing;

template <class A>
class EmbeddingCuda : public ::testing::Test {};
using ActTypes = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(EmbeddingCuda, ActTypes);

std::vector<int32_t> random_tokens(Rng& rng, int64_t rows, int64_t vocab) {
  std::vector<int32_t> t(rows);
  for (auto& x : t) x = int32_t(rng.below(uint64_t(vocab)));
  t[0] = t[rows - 1] = int32_t(vocab - 1);  // the last table row and a run that spans the batch
  return t;
}

TYPED_TEST(EmbeddingCuda, ForwardCopiesRowsAndBackwardMatchesCpu) {
  SKIP_WITHOUT_GPU();
  using A = TypeParam;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t batch = 2, rows = 1000, dim = 136, vocab = 57;  // ~18 occurrences per token
  const std::vector<int32_t> tokens = random_tokens(rng, rows, vocab);
  const Vec table = rounded<float>(normal_vec(rng, vocab * dim));
  const Vec dout = rounded<A>(normal_vec(rng, rows * dim));
  const Vec dtable0 = rounded<float>(normal_vec(rng, vocab * dim));
  Dev<int32_t> d_tok = upload_ids(tokens);
  Dev<float> d_table(table), d_dtable(dtable0);
  Dev<A> d_out(size_t(rows * dim)), d_dout(dout);
  Dev<int> bad(1);
  cudaMemset(bad.p, 0, sizeof(int));
  d_out.poison();
  embedding_forward_cuda<A>(d_tok.p, d_table.p, d_out.p, rows, dim, vocab, bad.p, nullptr);
  Dev<char> ws(embedding_backward_workspace_bytes(rows));
  embedding_backward_cuda<A>(d_tok.p, d_dout.p, d_dtable.p, rows, dim, vocab, batch, ws.p, nullptr);
  sync_ok();
  EXPECT_EQ(bad.raw()[0], 0);

  Vec out(rows * dim);
  embedding_forward<double>(tokens.data(), table.data(), out.data(), rows, dim, vocab);
  EXPECT_EQ(rel_err(d_out.get(), rounded<A>(out)), 0.0) << "forward is a copy (rounded to the activation type)";

  // Float additions on the host in reverse token order (last token first, sequences last to
  // first within a token): the GPU adds in the same order.
  std::vector<float> dtable_f(dtable0.begin(), dtable0.end());
  const int64_t len = rows / batch;
  for (int64_t t = len - 1; t >= 0; --t)
    for (int64_t b = batch - 1; b >= 0; --b) {
      const int64_t r = b * len + t;
      for (int64_t c = 0; c < dim; ++c) dtable_f[size_t(tokens[size_t(r)] * dim + c)] += float(dout[size_t(r * dim + c)]);
    }
  EXPECT_TRUE(bitwise_equal(d_dtable.raw(), dtable_f)) << "backward differs from the reverse-order float sum";
  Vec dtable = dtable0;
  embedding_backward<double>(tokens.data(), dout.data(), dtable.data(), rows, dim);
  EXPECT_LE(rel_err(d_dtable.get(), dtable), tolerance<float>());
}

TYPED_TEST(EmbeddingCuda, BackwardIsBitwiseRepeatable) {
  SKIP_WITHOUT_GPU();
  using A = TypeParam;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t rows = 4099, dim = 520, vocab = 300;
  const std::vector<int32_t> tokens = random_tokens(rng, rows, vocab);
  Dev<int32_t> d_tok = upload_ids(tokens);
  Dev<A> d_dout(normal_vec(rng, rows * dim));
  const Vec dtable0 = normal_vec(rng, vocab * dim);
  Dev<char> ws(embedding_backward_workspace_bytes(rows));
  std::vector<std::vector<float>> runs;
  for (int r = 0; r < 2; ++r) {
    Dev<float> d_dtable(dtable0);
    embedding_backward_cuda<A>(d_tok.p, d_dout.p, d_dtable.p, rows, dim, vocab, 1, ws.p, nullptr);
    sync_ok();
    runs.push_back(d_dtable.raw());
  }
  EXPECT_TRUE(bitwise_equal(runs[0], runs[1]));
}

// Chunks of the sequences (cut anywhere: the order is per token) run last chunk first give the
// unsplit scatter-add bitwise.
TYPED_TEST(EmbeddingCuda, BackwardOverChunksRunLastFirstIsBitwiseTheWholeRun) {
  SKIP_WITHOUT_GPU();
  using A = TypeParam;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t batch = 3, len = 400, dim = 64, vocab = 50;
  const std::vector<int32_t> tokens = random_tokens(rng, batch * len, vocab);
  const Vec dout = normal_vec(rng, batch * len * dim), dtable0 = normal_vec(rng, vocab * dim);
  auto run = [&](const std::vector<int64_t>& cuts) {  // chunk [cuts[c], cuts[c + 1]), last first
    Dev<float> d_dtable(dtable0);
    for (size_t c = cuts.size() - 1; c-- > 0;) {
      const int64_t t0 = cuts[c], n = cuts[c + 1] - t0;
      std::vector<int32_t> tok;
      Vec dy;
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t t = t0; t < t0 + n; ++t) {
          tok.push_back(tokens[size_t(b * len + t)]);
          dy.insert(dy.end(), dout.begin() + (b * len + t) * dim, dout.begin() + (b * len + t + 1) * dim);
        }
      Dev<int32_t> d_tok = upload_ids(tok);
      Dev<A> d_dout(dy);
      Dev<char> ws(embedding_backward_workspace_bytes(batch * n));
      embedding_backward_cuda<A>(d_tok.p, d_dout.p, d_dtable.p, batch * n, dim, vocab, batch, ws.p, nullptr);
      sync_ok();
    }
    return d_dtable.raw();
  };
  const std::vector<float> whole = run({0, len});
  EXPECT_TRUE(bitwise_equal(run({0, 128, 384, len}), whole)) << "cuts at 128, 384";
  EXPECT_TRUE(bitwise_equal(run({0, 77, 150, 333, len}), whole)) << "cuts at 77, 150, 333";
}

TEST(EmbeddingCudaChecks, BadTokenIsFlaggedAndItsRowZeroed) {
  SKIP_WITHOUT_GPU();
  const int64_t dim = 16, vocab = 10;
  const std::vector<int32_t> tokens = {3, 10, -1, 9};
  Dev<int32_t> d_tok = upload_ids(tokens);
  Dev<float> table(Vec(vocab * dim, 1.0));
  Dev<float> out(size_t(4 * dim));
  out.poison();
  Dev<int> bad(1);
  cudaMemset(bad.p, 0, sizeof(int));
  embedding_forward_cuda<float>(d_tok.p, table.p, out.p, 4, dim, vocab, bad.p, nullptr);
  sync_ok();
  EXPECT_EQ(bad.raw()[0], 1);
  const Vec o = out.get();
  EXPECT_EQ(o[0], 1.0);
  EXPECT_EQ(o[dim], 0.0);
  EXPECT_EQ(o[2 * dim], 0.0);
  EXPECT_EQ(o[3 * dim], 1.0);
  EXPECT_THROW(embedding_forward_cuda<float>(d_tok.p, table.p, out.p, 4, 12, vocab, nullptr, nullptr), Error)
      << "dim must be a multiple of 8";
}

}  // namespace
}  // namespace stateflow
