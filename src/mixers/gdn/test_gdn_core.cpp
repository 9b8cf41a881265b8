// Gated DeltaNet core: chunkwise == token recurrence, StateFlow split == unsplit, both
// backward passes == central finite differences, float32 accuracy, nullptr conventions.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#if defined(__SSE2__)
#include <xmmintrin.h>
#endif

#include "core/error.h"
#include "mixers/gdn/gdn_core.h"
#include "test_util.h"

using namespace stateflow;
using stateflow::testing::fresh_seed;
using stateflow::testing::rel_err;

namespace {

enum class Algo { recurrent, chunked };

// One call's inputs, laid out as gdn_core.h says. null_S_in / null_dS_out pass nullptr
// instead of the (then ignored) tensors.
template <class T>
struct Problem {
  GdnDims d;
  std::vector<T> q, k, v, beta, g, S_in, dO, dS_out;
  bool null_S_in = false, null_dS_out = false;

  const T* S_in_ptr() const { return null_S_in ? nullptr : S_in.data(); }
  const T* dS_out_ptr() const { return null_dS_out ? nullptr : dS_out.data(); }
};

template <class T>
struct Forward {
  std::vector<T> o, S_out;
};

const std::array<const char*, 6> kGradNames = {"dq", "dk", "dv", "dbeta", "dg", "dS_in"};
template <class T>
using Grads = std::array<std::vector<T>, 6>;  // in kGradNames order

double softplus(double x) { return x > 20 ? x : std::log1p(std::exp(x)); }
double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

void l2_normalise_rows(std::vector<double>& x, int64_t width) {
  for (size_t r = 0; r < x.size(); r += width) {
    double n2 = 0;
    for (int64_t j = 0; j < width; ++j) n2 += x[r + j] * x[r + j];
    const double inv = 1 / std::sqrt(n2 + 1e-6);
    for (int64_t j = 0; j < width; ++j) x[r + j] *= inv;
  }
}

// Inputs as the layer produces them (the oracle's make_inputs): unit q, k; beta = sigmoid;
// g = -exp(A_log) softplus(a + dt_bias) with per-head A_log, dt_bias; a non-zero S_in.
Problem<double> make_problem(Rng& rng, int64_t batch, int64_t len, int64_t heads, int64_t dk, int64_t dv,
                             int64_t block) {
  using stateflow::testing::random_vec;
  Problem<double> p;
  p.d = GdnDims{batch, len, heads, dk, dv, block, 1 / std::sqrt(double(dk))};
  const int64_t rows = batch * len * heads;
  p.q = random_vec<double>(rng, rows * dk);
  p.k = random_vec<double>(rng, rows * dk);
  l2_normalise_rows(p.q, dk);
  l2_normalise_rows(p.k, dk);
  p.v = random_vec<double>(rng, rows * dv);
  p.beta.resize(rows);
  p.g.resize(rows);
  std::vector<double> A_log(heads), dt_bias(heads);
  for (int64_t h = 0; h < heads; ++h) {
    A_log[h] = std::log(rng.uniform(1, 16));
    dt_bias[h] = std::log(std::expm1(rng.uniform(0.001, 0.1)));  // inverse softplus
  }
  for (int64_t i = 0; i < rows; ++i) {
    p.beta[i] = sigmoid(rng.normal());
    p.g[i] = -std::exp(A_log[i % heads]) * softplus(rng.normal() + dt_bias[i % heads]);
  }
  p.S_in = random_vec<double>(rng, batch * heads * dv * dk, 0.5);
  p.dO = random_vec<double>(rng, rows * dv);
  p.dS_out = random_vec<double>(rng, batch * heads * dv * dk);
  return p;
}

template <class T>
std::vector<T> cast_vec(const std::vector<double>& x) {
  return std::vector<T>(x.begin(), x.end());
}

template <class T>
Problem<T> cast_problem(const Problem<double>& p) {
  Problem<T> r;
  r.d = p.d;
  r.q = cast_vec<T>(p.q), r.k = cast_vec<T>(p.k), r.v = cast_vec<T>(p.v);
  r.beta = cast_vec<T>(p.beta), r.g = cast_vec<T>(p.g), r.S_in = cast_vec<T>(p.S_in);
  r.dO = cast_vec<T>(p.dO), r.dS_out = cast_vec<T>(p.dS_out);
  return r;
}

template <class T>
Forward<T> run_forward(const Problem<T>& p, Algo algo) {
  const GdnDims& d = p.d;
  Forward<T> f{std::vector<T>(d.batch * d.len * d.heads * d.dv), std::vector<T>(d.batch * d.heads * d.dv * d.dk)};
  auto fn = algo == Algo::chunked ? gdn_chunk_forward<T> : gdn_recurrent_forward<T>;
  fn(d, p.q.data(), p.k.data(), p.v.data(), p.beta.data(), p.g.data(), p.S_in_ptr(), f.o.data(), f.S_out.data());
  return f;
}

template <class T>
Grads<T> zero_grads(const Problem<T>& p) {
  return {std::vector<T>(p.q.size()),    std::vector<T>(p.k.size()), std::vector<T>(p.v.size()),
          std::vector<T>(p.beta.size()), std::vector<T>(p.g.size()), std::vector<T>(p.S_in.size())};
}

template <class T>
Grads<T> run_backward(const Problem<T>& p, Algo algo) {
  const GdnDims& d = p.d;
  Grads<T> gr = zero_grads(p);
  auto fn = algo == Algo::chunked ? gdn_chunk_backward<T> : gdn_recurrent_backward<T>;
  fn(d, p.q.data(), p.k.data(), p.v.data(), p.beta.data(), p.g.data(), p.S_in_ptr(), p.dO.data(), p.dS_out_ptr(),
     gr[0].data(), gr[1].data(), gr[2].data(), gr[3].data(), gr[4].data(), gr[5].data());
  return gr;
}

template <class A, class B>
void expect_forward_close(const Forward<A>& got, const Forward<B>& ref, double tol, const std::string& what) {
  EXPECT_LE(rel_err(got.o, ref.o), tol) << what << ": o";
  EXPECT_LE(rel_err(got.S_out, ref.S_out), tol) << what << ": S_out";
}

template <class A, class B>
void expect_grads_close(const Grads<A>& got, const Grads<B>& ref, double tol, const std::string& what) {
  for (size_t i = 0; i < got.size(); ++i) EXPECT_LE(rel_err(got[i], ref[i]), tol) << what << ": " << kGradNames[i];
}

// ---------------------------------------------------------------------------------------
// StateFlow: the sequence as consecutive pieces, states chained forward, gradients backward
// ---------------------------------------------------------------------------------------

// Tokens [t0, t1) of every sequence of a [batch, len, heads, width] tensor.
template <class T>
std::vector<T> slice_tokens(const std::vector<T>& x, const GdnDims& d, int64_t t0, int64_t t1, int64_t width) {
  const int64_t row = d.heads * width;
  std::vector<T> out;
  for (int64_t b = 0; b < d.batch; ++b)
    out.insert(out.end(), x.begin() + (b * d.len + t0) * row, x.begin() + (b * d.len + t1) * row);
  return out;
}

template <class T>
void paste_tokens(const std::vector<T>& piece, const GdnDims& d, int64_t t0, int64_t t1, int64_t width,
                  std::vector<T>& x) {
  const int64_t row = d.heads * width, n = (t1 - t0) * row;
  for (int64_t b = 0; b < d.batch; ++b)
    std::copy(piece.begin() + b * n, piece.begin() + (b + 1) * n, x.begin() + (b * d.len + t0) * row);
}

template <class T>
Problem<T> piece_of(const Problem<T>& p, int64_t t0, int64_t t1) {
  const GdnDims& d = p.d;
  Problem<T> r;
  r.d = d;
  r.d.len = t1 - t0;
  r.q = slice_tokens(p.q, d, t0, t1, d.dk), r.k = slice_tokens(p.k, d, t0, t1, d.dk);
  r.v = slice_tokens(p.v, d, t0, t1, d.dv), r.dO = slice_tokens(p.dO, d, t0, t1, d.dv);
  r.beta = slice_tokens(p.beta, d, t0, t1, 1), r.g = slice_tokens(p.g, d, t0, t1, 1);
  return r;
}

template <class T>
std::pair<Forward<T>, Grads<T>> run_split(const Problem<T>& p, const std::vector<int64_t>& lens) {
  const GdnDims& d = p.d;
  std::vector<int64_t> starts = {0};
  for (int64_t n : lens) starts.push_back(starts.back() + n);
  EXPECT_EQ(starts.back(), d.len) << "piece lengths must sum to len";
  const size_t n_pieces = lens.size();
  Forward<T> f{std::vector<T>(p.dO.size()), p.S_in};
  std::vector<Problem<T>> pieces;
  for (size_t j = 0; j < n_pieces; ++j) {
    pieces.push_back(piece_of(p, starts[j], starts[j + 1]));
    pieces[j].S_in = f.S_out;  // the state the previous piece emitted
    Forward<T> fj = run_forward(pieces[j], Algo::chunked);
    paste_tokens(fj.o, d, starts[j], starts[j + 1], d.dv, f.o);
    f.S_out = fj.S_out;
  }
  Grads<T> gr = zero_grads(p);
  std::vector<T> dS = p.dS_out;
  for (size_t j = n_pieces; j-- > 0;) {
    pieces[j].dS_out = dS;  // the gradient the next piece sent back
    Grads<T> gj = run_backward(pieces[j], Algo::chunked);
    const std::array<int64_t, 5> widths = {d.dk, d.dk, d.dv, 1, 1};
    for (size_t i = 0; i < widths.size(); ++i) paste_tokens(gj[i], d, starts[j], starts[j + 1], widths[i], gr[i]);
    dS = gj[5];
  }
  gr[5] = dS;
  return {f, gr};
}

std::vector<int64_t> even_split(int64_t len, int64_t n) {
  std::vector<int64_t> lens;
  for (int64_t j = 0; j < n; ++j) lens.push_back((j + 1) * len / n - j * len / n);
  return lens;
}

std::string describe(const std::vector<int64_t>& lens) {
  std::string s = "pieces";
  for (int64_t n : lens) s += cat(' ', n);
  return s;
}

}  // namespace

// 1. The chunkwise algorithm reproduces the token recurrence for C dividing len or not,
//    C = 1 and C > len.
TEST(GdnCore, ChunkMatchesRecurrent) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (auto [dk, dv] : {std::pair<int64_t, int64_t>{8, 6}, {16, 12}}) {
    Problem<double> p = make_problem(rng, 2, 100, 2, dk, dv, 1);
    const Forward<double> f_ref = run_forward(p, Algo::recurrent);
    const Grads<double> g_ref = run_backward(p, Algo::recurrent);
    for (int64_t C : {1, 7, 16, 64, 128}) {
      p.d.block = C;
      const std::string what = "dk " + std::to_string(dk) + " dv " + std::to_string(dv) + " C " + std::to_string(C);
      expect_forward_close(run_forward(p, Algo::chunked), f_ref, 1e-12, what);
      expect_grads_close(run_backward(p, Algo::chunked), g_ref, 1e-11, what);
    }
  }
}

// 2. StateFlow: running the sequence as pieces with the boundary state passed forward and
//    its gradient passed back gives the unsplit result; bitwise when the edges are C-aligned.
TEST(GdnCore, SplitMatchesUnsplit) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const Problem<double> p = make_problem(rng, 2, 100, 2, 8, 6, 16);
  const Forward<double> f_ref = run_forward(p, Algo::chunked);
  const Grads<double> g_ref = run_backward(p, Algo::chunked);

  const auto [f_aligned, g_aligned] = run_split(p, {32, 48, 20});
  EXPECT_EQ(f_aligned.o, f_ref.o) << "C-aligned split must be bitwise: o";
  EXPECT_EQ(f_aligned.S_out, f_ref.S_out) << "C-aligned split must be bitwise: S_out";
  for (size_t i = 0; i < g_ref.size(); ++i)
    EXPECT_EQ(g_aligned[i], g_ref[i]) << "C-aligned split must be bitwise: " << kGradNames[i];

  std::vector<std::vector<int64_t>> splits = {{37, 13, 29, 21}, {1, 2, 3, 50, 44}};
  for (int64_t n : {2, 3, 4, 8}) splits.push_back(even_split(p.d.len, n));
  for (const auto& lens : splits) {
    const auto [f, gr] = run_split(p, lens);
    expect_forward_close(f, f_ref, 1e-12, describe(lens));
    expect_grads_close(gr, g_ref, 1e-11, describe(lens));
  }
}

// Central-difference check of one input's gradient, with the error relative to |grad| |u|
// (MATH.md section 8: "relative to |grad| of the tensor") via fd_directional's floor, so a
// random direction nearly orthogonal to the gradient cannot blow the ratio up.
double fd_error(const std::function<double()>& loss, std::vector<double>& x, const std::vector<double>& grad,
                Rng& rng) {
  double norm2 = 0;
  for (double v : grad) norm2 += v * v;
  const double floor = std::max(std::sqrt(norm2 * double(x.size())), 1e-8);  // |u| ~ sqrt(n)
  return stateflow::testing::fd_directional(loss, {&x}, {&grad}, rng, 3, 1e-5, floor);
}

// 3. Both hand-written backward passes against central finite differences of
//    L = <o, dO> + <S_out, dS_out>, with a negative control that the check can fail.
TEST(GdnCore, BackwardMatchesFiniteDifferences) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  Problem<double> p = make_problem(rng, 2, 23, 2, 5, 4, 8);
  const std::array<std::vector<double>*, 6> inputs = {&p.q, &p.k, &p.v, &p.beta, &p.g, &p.S_in};
  for (Algo algo : {Algo::recurrent, Algo::chunked}) {
    const char* name = algo == Algo::chunked ? "chunked C=8" : "recurrent";
    auto loss = [&] {
      const Forward<double> f = run_forward(p, algo);
      double l = 0;
      for (size_t i = 0; i < f.o.size(); ++i) l += f.o[i] * p.dO[i];
      for (size_t i = 0; i < f.S_out.size(); ++i) l += f.S_out[i] * p.dS_out[i];
      return l;
    };
    Grads<double> gr = run_backward(p, algo);
    for (size_t i = 0; i < inputs.size(); ++i)
      EXPECT_LE(fd_error(loss, *inputs[i], gr[i], rng), 1e-7) << name << ": " << kGradNames[i];

    // negative control: a 0.1% error in dg must be flagged
    for (double& x : gr[4]) x *= 1.001;
    EXPECT_GT(fd_error(loss, p.g, gr[4], rng), 1e-7) << name << ": the FD check missed dg scaled by 1.001";
  }
}

// 4. float32 arithmetic throughout stays close to the float64 recurrence.
TEST(GdnCore, Float32ChunkMatchesFloat64Recurrent) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const Problem<double> p = make_problem(rng, 2, 200, 2, 32, 32, 64);
  const Problem<float> p32 = cast_problem<float>(p);
  expect_forward_close(run_forward(p32, Algo::chunked), run_forward(p, Algo::recurrent), 1e-4, "float32");
  expect_grads_close(run_backward(p32, Algo::chunked), run_backward(p, Algo::recurrent), 1e-3, "float32");
}

// 5. nullptr S_in is a zero state and nullptr dS_out a zero gradient, for both algorithms.
TEST(GdnCore, NullStateMeansZero) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  Problem<double> zeros = make_problem(rng, 2, 37, 2, 8, 6, 16);
  std::fill(zeros.S_in.begin(), zeros.S_in.end(), 0.0);
  std::fill(zeros.dS_out.begin(), zeros.dS_out.end(), 0.0);
  Problem<double> nulls = zeros;
  nulls.null_S_in = nulls.null_dS_out = true;
  for (Algo algo : {Algo::recurrent, Algo::chunked}) {
    const Forward<double> fz = run_forward(zeros, algo), fn = run_forward(nulls, algo);
    EXPECT_EQ(fn.o, fz.o);
    EXPECT_EQ(fn.S_out, fz.S_out);
    const Grads<double> gz = run_backward(zeros, algo), gn = run_backward(nulls, algo);
    for (size_t i = 0; i < gz.size(); ++i) EXPECT_EQ(gn[i], gz[i]) << kGradNames[i];
    EXPECT_GT(rel_err(fz.S_out, std::vector<double>(fz.S_out.size())), 0) << "test inputs must do something";
  }
}

// Scaling the state that enters a chunk by e^eps is adding eps to its first token's log-decay, so
// that token's dg is the inner product of the entering state and its gradient, head by head
// (what tests/gradient_terms.h measures a decay parameter's inner terms with).
TEST(GdnCore, FirstTokensDecayGradientIsTheEnteringStateTimesItsGradient) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const Problem<double> p = make_problem(rng, 2, 37, 3, 8, 6, 16);
  const GdnDims& d = p.d;
  const int64_t n = d.dv * d.dk;
  for (Algo algo : {Algo::recurrent, Algo::chunked}) {
    const Grads<double> gr = run_backward(p, algo);
    for (int64_t b = 0; b < d.batch; ++b)
      for (int64_t h = 0; h < d.heads; ++h) {
        double inner = 0, magnitude = 0;
        for (int64_t e = (b * d.heads + h) * n; e < (b * d.heads + h + 1) * n; ++e)
          inner += gr[5][e] * p.S_in[e], magnitude += std::abs(gr[5][e] * p.S_in[e]);
        EXPECT_NEAR(gr[4][(b * d.len) * d.heads + h], inner, 1e-12 * magnitude)
            << (algo == Algo::chunked ? "chunked" : "recurrent") << ", sequence " << b << ", head " << h;
      }
  }
}

// An empty chunk passes the state and its gradient through unchanged.
TEST(GdnCore, EmptyChunkPassesStateThrough) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  Problem<double> p = make_problem(rng, 2, 0, 2, 8, 6, 16);
  for (Algo algo : {Algo::recurrent, Algo::chunked}) {
    EXPECT_EQ(run_forward(p, algo).S_out, p.S_in);
    EXPECT_EQ(run_backward(p, algo)[5], p.dS_out);
  }
  p.null_S_in = p.null_dS_out = true;
  const std::vector<double> zero_state(p.S_in.size());
  EXPECT_EQ(run_forward(p, Algo::chunked).S_out, zero_state);
  EXPECT_EQ(run_backward(p, Algo::chunked)[5], zero_state);
}

#if defined(__SSE2__)
// The chunk kernels flush denormals while they run; the caller's floating-point mode must
// be restored afterwards.
TEST(GdnCore, RestoresFloatingPointMode) {
  Rng rng(fresh_seed());
  const Problem<float> p = cast_problem<float>(make_problem(rng, 1, 20, 1, 8, 6, 8));
  const unsigned before = _mm_getcsr();
  run_forward(p, Algo::chunked);
  run_backward(p, Algo::chunked);
  EXPECT_EQ(_mm_getcsr(), before);
}
#endif

TEST(GdnCore, RejectsBadSubChunkSize) {
  Rng rng(fresh_seed());
  Problem<double> p = make_problem(rng, 1, 4, 1, 8, 6, 0);
  EXPECT_THROW(run_forward(p, Algo::chunked), Error);
  EXPECT_THROW(run_backward(p, Algo::chunked), Error);
}
