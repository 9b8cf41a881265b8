// Prefix attention kernels: against a plain full-sequence reference (explicit probability
// matrix), chunked == unchunked with the K/V gradient accumulated across chunks (1-token
// chunks too), rows past the chunk never read, and finite differences in float64.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "mixers/attention/prefix_attention.h"
#include "test_util.h"

using namespace stateflow;
using namespace stateflow::testing;

namespace {

struct Shape4 {
  int64_t B, T, Hq, Hkv, D;
  size_t q_size() const { return size_t(B * T * Hq * D); }
  size_t kv_size() const { return size_t(B * T * Hkv * D); }
  AttentionDims whole() const { return {B, T, 0, T, Hq, Hkv, D, 1.0 / std::sqrt(double(D))}; }
};

// The definition: P = softmax(scale q k^T) under the causal mask, o = P v, and its gradients
// through the softmax Jacobian, one (sequence, head) at a time with the whole T x T matrix.
struct Reference {
  std::vector<double> o, lse, dq, dk, dv;
};

Reference reference(const Shape4& s, const std::vector<double>& q, const std::vector<double>& k,
                    const std::vector<double>& v, const std::vector<double>& dout) {
  Reference r{std::vector<double>(s.q_size()), std::vector<double>(size_t(s.B * s.T * s.Hq)),
              std::vector<double>(s.q_size()), std::vector<double>(s.kv_size()), std::vector<double>(s.kv_size())};
  const double scale = 1.0 / std::sqrt(double(s.D));
  auto qi = [&](int64_t b, int64_t t, int64_t h) { return ((b * s.T + t) * s.Hq + h) * s.D; };
  auto ki = [&](int64_t b, int64_t t, int64_t h) { return ((b * s.T + t) * s.Hkv + h / (s.Hq / s.Hkv)) * s.D; };
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.Hq; ++h) {
      std::vector<double> P(size_t(s.T * s.T), 0.0), dP(size_t(s.T * s.T), 0.0);
      for (int64_t i = 0; i < s.T; ++i) {
        double m = -INFINITY, l = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double x = 0;
          for (int64_t e = 0; e < s.D; ++e) x += q[qi(b, i, h) + e] * k[ki(b, j, h) + e];
          P[i * s.T + j] = scale * x, m = std::max(m, scale * x);
        }
        for (int64_t j = 0; j <= i; ++j) l += std::exp(P[i * s.T + j] - m);
        for (int64_t j = 0; j <= i; ++j) P[i * s.T + j] = std::exp(P[i * s.T + j] - m) / l;
        r.lse[(b * s.T + i) * s.Hq + h] = m + std::log(l);
        for (int64_t j = 0; j <= i; ++j)
          for (int64_t e = 0; e < s.D; ++e) {
            r.o[qi(b, i, h) + e] += P[i * s.T + j] * v[ki(b, j, h) + e];
            dP[i * s.T + j] += dout[qi(b, i, h) + e] * v[ki(b, j, h) + e];
            r.dv[ki(b, j, h) + e] += P[i * s.T + j] * dout[qi(b, i, h) + e];
          }
      }
      for (int64_t i = 0; i < s.T; ++i) {
        double pdp = 0;
        for (int64_t j = 0; j <= i; ++j) pdp += P[i * s.T + j] * dP[i * s.T + j];
        for (int64_t j = 0; j <= i; ++j) {
          const double ds = P[i * s.T + j] * (dP[i * s.T + j] - pdp);
          for (int64_t e = 0; e < s.D; ++e) {
            r.dq[qi(b, i, h) + e] += scale * ds * k[ki(b, j, h) + e];
            r.dk[ki(b, j, h) + e] += scale * ds * q[qi(b, i, h) + e];
          }
        }
      }
    }
  return r;
}

template <class T> std::vector<T> cast_vec(const std::vector<double>& v) { return std::vector<T>(v.begin(), v.end()); }

struct Inputs {
  Shape4 s;
  std::vector<double> q, k, v, dout;
  Inputs(Rng& rng, Shape4 shape)
      : s(shape),
        q(random_vec<double>(rng, s.q_size())),
        k(random_vec<double>(rng, s.kv_size())),
        v(random_vec<double>(rng, s.kv_size())),
        dout(random_vec<double>(rng, s.q_size())) {}
};

template <class T> void expect_whole_matches_reference(const Shape4& shape, double tol) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " head_dim " + std::to_string(shape.D));
  Rng rng(seed);
  Inputs in(rng, shape);
  const Reference ref = reference(shape, in.q, in.k, in.v, in.dout);
  const std::vector<T> q = cast_vec<T>(in.q), k = cast_vec<T>(in.k), v = cast_vec<T>(in.v),
                       dout = cast_vec<T>(in.dout);
  std::vector<T> o(q.size()), lse(ref.lse.size()), dq(q.size()), dk(k.size()), dv(v.size());
  const AttentionDims d = shape.whole();
  prefix_attention_forward<T>(d, q.data(), k.data(), v.data(), o.data(), lse.data());
  prefix_attention_backward<T>(d, q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), dq.data(),
                               dk.data(), dv.data());
  EXPECT_LE(rel_err(o, ref.o), tol) << "o";
  EXPECT_LE(rel_err(lse, ref.lse), tol) << "lse";
  EXPECT_LE(rel_err(dq, ref.dq), tol) << "dq";
  EXPECT_LE(rel_err(dk, ref.dk), tol) << "dk";
  EXPECT_LE(rel_err(dv, ref.dv), tol) << "dv";
}

// Chunks forward in order, each writing its K/V rows into buffers whose later rows hold NaN
// (a read past the chunk would show), then backward last chunk first, adding into dK/dV.
void expect_chunked_matches_whole(const Shape4& s, const std::vector<int64_t>& pieces) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " pieces " + std::to_string(pieces.size()));
  Rng rng(seed);
  Inputs in(rng, s);
  const Reference ref = reference(s, in.q, in.k, in.v, in.dout);
  const int64_t row = s.Hkv * s.D, qrow = s.Hq * s.D;
  std::vector<double> kbuf(in.k.size(), std::numeric_limits<double>::quiet_NaN()), vbuf = kbuf;
  std::vector<double> o(in.q.size()), lse(ref.lse.size()), dq(in.q.size()), dk(in.k.size(), 0.0), dv = dk;
  std::vector<AttentionDims> dims;
  // one chunk's slice [B, len, ...] of a [B, T, ...] array, and back
  auto gather = [&](const std::vector<double>& a, int64_t w, const AttentionDims& d) {
    std::vector<double> out(size_t(s.B * d.len * w));
    for (int64_t b = 0; b < s.B; ++b)
      std::copy_n(a.begin() + (b * s.T + d.offset) * w, d.len * w, out.begin() + b * d.len * w);
    return out;
  };
  auto scatter = [&](const std::vector<double>& piece, int64_t w, const AttentionDims& d, std::vector<double>& a) {
    for (int64_t b = 0; b < s.B; ++b)
      std::copy_n(piece.begin() + b * d.len * w, d.len * w, a.begin() + (b * s.T + d.offset) * w);
  };
  int64_t offset = 0;
  for (int64_t len : pieces) {
    AttentionDims d = s.whole();
    d.offset = offset, d.len = len;
    scatter(gather(in.k, row, d), row, d, kbuf);  // the chunk writes its rows once
    scatter(gather(in.v, row, d), row, d, vbuf);
    std::vector<double> oc(size_t(s.B * len * qrow)), lc(size_t(s.B * len * s.Hq));
    prefix_attention_forward<double>(d, gather(in.q, qrow, d).data(), kbuf.data(), vbuf.data(), oc.data(), lc.data());
    scatter(oc, qrow, d, o), scatter(lc, s.Hq, d, lse);
    dims.push_back(d), offset += len;
  }
  EXPECT_LE(rel_err(o, ref.o), 1e-12) << "o";
  EXPECT_LE(rel_err(lse, ref.lse), 1e-12) << "lse";
  for (size_t c = dims.size(); c-- > 0;) {
    const AttentionDims& d = dims[c];
    std::vector<double> dqc(size_t(s.B * d.len * qrow));
    prefix_attention_backward<double>(d, gather(in.q, qrow, d).data(), kbuf.data(), vbuf.data(),
                                      gather(o, qrow, d).data(), gather(lse, s.Hq, d).data(),
                                      gather(in.dout, qrow, d).data(), dqc.data(), dk.data(), dv.data());
    scatter(dqc, qrow, d, dq);
    // Chunks N-1..c are done: chunk c's K/V rows now hold their whole-sequence gradient.
    EXPECT_LE(rel_err(gather(dk, row, d), gather(ref.dk, row, d)), 1e-12) << "dk rows of chunk " << c;
    EXPECT_LE(rel_err(gather(dv, row, d), gather(ref.dv, row, d)), 1e-12) << "dv rows of chunk " << c;
  }
  EXPECT_LE(rel_err(dq, ref.dq), 1e-12) << "dq";
  EXPECT_LE(rel_err(dk, ref.dk), 1e-12) << "dk";
  EXPECT_LE(rel_err(dv, ref.dv), 1e-12) << "dv";
}

}  // namespace

TEST(PrefixAttention, WholeSequenceMatchesReferenceF64) {
  expect_whole_matches_reference<double>({2, 19, 4, 2, 5}, 1e-13);
  expect_whole_matches_reference<double>({1, 9, 2, 2, 3}, 1e-13);  // one query head per K/V head
}

TEST(PrefixAttention, WholeSequenceMatchesReferenceF32) {
  expect_whole_matches_reference<float>({2, 19, 4, 2, 5}, 1e-5);
}

TEST(PrefixAttention, HeadDims128And256) {
  expect_whole_matches_reference<double>({1, 7, 4, 1, 128}, 1e-13);
  expect_whole_matches_reference<double>({1, 7, 2, 1, 256}, 1e-13);
  expect_whole_matches_reference<float>({1, 7, 2, 1, 256}, 1e-5);
}

TEST(PrefixAttention, ChunkedEqualsWholeWithAccumulatedKvGradients) {
  const Shape4 s{2, 40, 4, 2, 6};
  expect_chunked_matches_whole(s, {13, 20, 1, 6});
  expect_chunked_matches_whole(s, {40});
  expect_chunked_matches_whole(s, std::vector<int64_t>(40, 1));  // 1-token chunks
}

// Before chunk j's own backward, its rows still miss that chunk's share: the order matters.
TEST(PrefixAttention, KvGradientOfAChunkIsIncompleteBeforeItsOwnBackward) {
  Rng rng(fresh_seed());
  const Shape4 s{1, 12, 2, 1, 4};
  Inputs in(rng, s);
  const Reference ref = reference(s, in.q, in.k, in.v, in.dout);
  std::vector<double> o(in.q.size()), lse(ref.lse.size()), dq(in.q.size()), dk(in.k.size(), 0.0), dv = dk;
  prefix_attention_forward<double>(s.whole(), in.q.data(), in.k.data(), in.v.data(), o.data(), lse.data());
  AttentionDims later = s.whole();  // the backward of the last 6 rows only
  later.offset = 6, later.len = 6;
  const int64_t qrow = s.Hq * s.D;
  prefix_attention_backward<double>(later, in.q.data() + 6 * qrow, in.k.data(), in.v.data(), o.data() + 6 * qrow,
                                    lse.data() + 6 * s.Hq, in.dout.data() + 6 * qrow, dq.data(), dk.data(), dv.data());
  const std::vector<double> first_dk(dk.begin(), dk.begin() + 6 * s.D), ref_first(ref.dk.begin(), ref.dk.begin() + 6 * s.D);
  EXPECT_GT(rel_err(first_dk, ref_first), 1e-3);
}

TEST(PrefixAttention, BackwardMatchesFiniteDifferences) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const Shape4 s{2, 11, 4, 2, 3};
  Inputs in(rng, s);
  AttentionDims d = s.whole();
  d.offset = 4, d.len = 7;  // a chunk against a prefix: queries are the last 7 rows
  const int64_t qn = s.B * d.len * s.Hq * s.D;
  std::vector<double> q(in.q.begin(), in.q.begin() + qn), dout(in.dout.begin(), in.dout.begin() + qn);
  std::vector<double> o(q.size()), lse(size_t(s.B * d.len * s.Hq));
  auto loss = [&] {
    prefix_attention_forward<double>(d, q.data(), in.k.data(), in.v.data(), o.data(), lse.data());
    double l = 0;
    for (size_t i = 0; i < o.size(); ++i) l += o[i] * dout[i];
    return l;
  };
  loss();
  std::vector<double> dq(q.size()), dk(in.k.size(), 0.0), dv = dk;
  prefix_attention_backward<double>(d, q.data(), in.k.data(), in.v.data(), o.data(), lse.data(), dout.data(),
                                    dq.data(), dk.data(), dv.data());
  EXPECT_LE(fd_directional(loss, {&q, &in.k, &in.v}, {&dq, &dk, &dv}, rng, 4), 1e-7);
}

TEST(PrefixAttention, InconsistentDimsAreErrors) {
  AttentionDims d{1, 8, 4, 10, 4, 2, 8, 1.0};
  expect_error([&] { check_attention_dims(d); }, "does not fit K/V buffers of 10 rows");
  d.kv_rows = 12, d.q_heads = 3;
  expect_error([&] { check_attention_dims(d); }, "not a multiple of 2 K/V heads");
}
