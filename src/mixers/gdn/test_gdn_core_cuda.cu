// GPU GDN chunk core: the StateFlow properties on the gdn_core op's inputs and references
// (mixers/gdn/gdn_core_op.cpp; the op test, tests/cuda/test_op_defs_cuda.cpp, checks each
// pass against the float64 recurrence, the split core's too): splits at multiples of C
// (unsplit core) or of the piece length (split core) are bitwise neutral, other splits stay
// within 2x the unsplit error, null states mean zero, every value and piece tile and every row
// sweep block agrees, the row sweeps match the float64 recurrence like the tile sweeps, the
// split core matches the float64 recurrence at extreme decays, the backward from the saved
// forward equals the recompute, and every call is bitwise repeatable. Skips when no GPU is present.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "kernels/op_def.h"
#include "kernels/cuda/levers.h"
#include "mixers/gdn/gdn_core.h"
#include "mixers/gdn/gdn_core_cuda.h"
#include "cuda_test_util.h"
#include "test_util.h"

namespace stateflow {
namespace {

using namespace testing;

constexpr int64_t DK = 128, DV = 128, C = 64;

// One problem: inputs already rounded to what the GPU stores (bf16 vectors, fp32 scalars).
struct Problem {
  GdnDims d;
  Vec q, k, v, beta, g, S_in, dO, dS_out;
};

// The gdn_core op's shape and its arrays' names (mixers/gdn/gdn_core_op.cpp).
OpShape shape_of(const GdnDims& d) {
  return {{{"batch", d.batch}, {"len", d.len}, {"heads", d.heads}, {"value_tile", 0}}};
}

// Inputs as the gdn_core op draws them (what its benchmark times): l2-normalised q, k, gates
// as the layer makes them.
Problem make_problem(Rng& rng, int64_t B, int64_t T, int64_t H) {
  Problem p;
  p.d.batch = B, p.d.len = T, p.d.heads = H, p.d.dk = DK, p.d.dv = DV, p.d.block = C;
  p.d.scale = 1.0 / std::sqrt(double(DK));
  const OpHost in = draw_inputs(op_named("gdn_core"), shape_of(p.d), DType::BF16, rng.next_u64());
  p.q = in.at("q"), p.k = in.at("k"), p.v = in.at("v"), p.dO = in.at("dO");
  p.beta = in.at("beta"), p.g = in.at("g"), p.S_in = in.at("S_in"), p.dS_out = in.at("dS_out");
  return p;
}

Problem slice(const Problem& p, int64_t t0, int64_t t1) {
  Problem s = p;
  s.d.len = t1 - t0;
  s.q = slice_time(p.q, p.d, DK, t0, t1), s.k = slice_time(p.k, p.d, DK, t0, t1);
  s.v = slice_time(p.v, p.d, DV, t0, t1), s.dO = slice_time(p.dO, p.d, DV, t0, t1);
  s.beta = slice_time(p.beta, p.d, 1, t0, t1), s.g = slice_time(p.g, p.d, 1, t0, t1);
  return s;
}

// The gdn_core op's float64 references (the token recurrence, mixers/gdn/gdn_core.h) on the
// same rounded inputs.
struct Ref {
  Vec o, S_out, dq, dk, dv, dbeta, dg, dS_in;
};

Ref reference(const Problem& p) {
  const OpDef& op = op_named("gdn_core");
  const OpShape shape = shape_of(p.d);
  OpHost h = {{"q", p.q}, {"k", p.k}, {"v", p.v}, {"beta", p.beta}, {"g", p.g}, {"S_in", p.S_in}, {"dO", p.dO},
              {"dS_out", p.dS_out}};
  for (const OpArray& a : op.arrays(shape))
    if (a.role == Role::Out) h[a.name].assign(size_t(a.size), 0.0);
  for (const char* pass : {"fwd", "bwd"}) op.pass(pass).reference(shape, DType::BF16, h);
  return {h.at("o"), h.at("S_out"), h.at("dq"), h.at("dk"), h.at("dv"), h.at("dbeta"), h.at("dg"), h.at("dS_in")};
}

// Runs forward and backward on the GPU (outputs poisoned with NaN first).
struct Gpu {
  Vec o, S_out, dq, dk, dv, dbeta, dg, dS_in;
  std::vector<bf16> raw_o, raw_dq, raw_dk, raw_dv;  // for bitwise comparisons
};

struct RunOptions {
  bool with_S_in = true, with_dS_out = true;
  // T kept in a buffer of its own from the forward to the backward (GdnCudaConfig::T_buffer,
  // kept_T), the workspace filled with NaN in between (the layer's workspace is scratch).
  bool keep_T = false;
  // V_new and the entering states kept in a buffer of their own likewise (sweep_buffer,
  // kept_sweep; the workspace then has no room for them).
  bool keep_sweep = false;
  // With keep_T, >= 0: the backward's GdnCudaConfig::pre (the forward runs cfg's).
  int backward_pre = -1;
  // The workspace filled with NaN before the forward, so that a kernel reading what another has
  // not yet written (an overlapped consumer ahead of its sweep) reads NaN, not an earlier run's bits.
  bool poison_workspace = false;
  GdnCudaConfig cfg;
};

RunOptions unsplit(int sweep = GdnCudaConfig::kDefaultSweep, int key_split = 0, int sweep_warps = 0) {
  RunOptions opt;
  opt.cfg.piece_len = GdnCudaConfig::kUnsplit;
  opt.cfg.sweep = sweep, opt.cfg.sweep_key_split = key_split, opt.cfg.sweep_warps = sweep_warps;
  return opt;
}

// The unsplit core's sweeps, by name for traces (row sweeps: whole, halved and quartered key columns).
struct SweepCase {
  const char* name;
  int sweep, key_split;
};
const std::vector<SweepCase> kSweeps = {{"row sweeps", GdnCudaConfig::kRowSweeps, 1},
                                        {"row sweeps, split keys", GdnCudaConfig::kRowSweeps, 2},
                                        {"quarter sweeps", GdnCudaConfig::kRowSweeps, 4},
                                        {"tile sweeps", GdnCudaConfig::kTileSweeps, 0}};

// Warps per block a row sweep with this key split can run with (each a different row grouping).
std::vector<int> row_tilings(int key_split) {
  return key_split == 4 ? std::vector<int>{4, 8} : std::vector<int>{2, 4, 8};
}

RunOptions pieces_of(int len, int tile = 0) {
  RunOptions opt;
  opt.cfg.piece_len = len;
  opt.cfg.piece_tile = tile;
  return opt;
}

Gpu run_gpu(const Problem& p, const RunOptions& opt = {}) {
  const GdnDims& d = p.d;
  Dev<bf16> q(p.q), k(p.k), v(p.v), dO(p.dO);
  Dev<float> beta(p.beta), g(p.g), S_in(p.S_in), dS_out(p.dS_out);
  Dev<bf16> o(p.v.size()), dq(p.q.size()), dk(p.k.size()), dv(p.v.size());
  Dev<float> S_out(p.S_in.size()), dbeta(p.beta.size()), dg(p.g.size()), dS_in(p.S_in.size());
  for (auto* x : {&o, &dq, &dk, &dv}) x->poison();
  for (auto* x : {&S_out, &dbeta, &dg, &dS_in}) x->poison();
  Dev<bf16> kept_T(opt.keep_T ? gdn_cuda_kept_T_bytes(d) / sizeof(bf16) : 0);
  Dev<char> kept_sweep(opt.keep_sweep ? gdn_cuda_kept_sweep_bytes(d) : 0);
  GdnCudaConfig cfg = opt.cfg;
  if (opt.keep_T) cfg.T_buffer = kept_T.p;
  if (opt.keep_sweep) cfg.sweep_buffer = kept_sweep.p;
  Dev<char> ws(gdn_cuda_workspace_bytes(d, cfg));
  if (opt.poison_workspace) EXPECT_EQ(cudaMemset(ws.p, 0xff, ws.n), cudaSuccess);
  const float* s_in = opt.with_S_in ? S_in.p : nullptr;
  gdn_chunk_forward_cuda(d, q.p, k.p, v.p, beta.p, g.p, s_in, o.p, S_out.p, ws.p, nullptr, cfg);
  if (opt.keep_T || opt.keep_sweep) {
    EXPECT_EQ(cudaMemset(ws.p, 0xff, ws.n), cudaSuccess);  // NaN in every fp32 and bf16 slot
    cfg.kept_T = opt.keep_T, cfg.kept_sweep = opt.keep_sweep;
    if (opt.backward_pre >= 0) cfg.pre = opt.backward_pre;
  }
  gdn_chunk_backward_cuda(d, q.p, k.p, v.p, beta.p, g.p, s_in, dO.p, opt.with_dS_out ? dS_out.p : nullptr, dq.p, dk.p,
                          dv.p, dbeta.p, dg.p, dS_in.p, ws.p, nullptr, cfg);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  Gpu r{o.get(), S_out.get(), dq.get(), dk.get(), dv.get(), dbeta.get(), dg.get(), dS_in.get()};
  r.raw_o = o.raw(), r.raw_dq = dq.raw(), r.raw_dk = dk.raw(), r.raw_dv = dv.raw();
  return r;
}

// Named error of every output against the reference.
using ErrorFn = double (*)(const Vec&, const Vec&);

std::vector<std::pair<const char*, double>> errors(const Gpu& x, const Ref& r, ErrorFn err = rel_err<double, double>) {
  return {{"o", err(x.o, r.o)},       {"S_out", err(x.S_out, r.S_out)}, {"dq", err(x.dq, r.dq)},
          {"dk", err(x.dk, r.dk)},    {"dv", err(x.dv, r.dv)},          {"dbeta", err(x.dbeta, r.dbeta)},
          {"dg", err(x.dg, r.dg)},    {"dS_in", err(x.dS_in, r.dS_in)}};
}

// The gdn_core op's band for each output (bf16 operands; the per-token gate gradients looser).
double tolerance(const std::string& name) {
  return op_named("gdn_core").array(shape_of({}), name).tolerance.at(DType::BF16);
}

// Every output of x in the float64 band and its whole-tensor error within 2x the baseline's
// (e_base: rms errors of the path x is compared with). With g ~ -20, dg is held to the 2x rule
// only (see the split core's test), and dbeta to twice its band: the state is gone after every
// token, so a token's dbeta is about (k.q)(dO.v), two 128-term sums of random sign whose bf16
// error reaches the band's edge on rare seeds (18242146499805860504: 0.0305 of the largest entry
// against 0.03, the same for every key split, on an H200). A wrong term is an O(1) error.
void expect_band_and_twice(const Gpu& x, const Ref& ref, const std::vector<std::pair<const char*, double>>& e_base,
                           bool decays_near_0) {
  const auto e_max = errors(x, ref), e = errors(x, ref, rms_rel_err<double, double>);
  for (size_t i = 0; i < e.size(); ++i) {
    const std::string name = e[i].first;
    SCOPED_TRACE("output " + name);
    const double band = decays_near_0 && name == "dbeta" ? 2 * tolerance(name) : tolerance(name);
    if (!(decays_near_0 && name == "dg")) EXPECT_LE(e_max[i].second, band);
    EXPECT_LE(e[i].second, 2 * e_base[i].second + 1e-6);
  }
}

// A fresh seed for the tests that draw inputs, named in every failure's trace.
class GdnCoreCuda : public ::testing::Test {
 protected:
  const uint64_t seed = fresh_seed();
  const ::testing::ScopedTrace seed_trace{__FILE__, __LINE__, "seed " + std::to_string(seed)};
  Rng rng{seed};
};

// Null states mean zero; the tile sweeps give the same bits for every value tile and the row
// sweeps for every number of warps per block (each row's arithmetic is the same).
TEST_F(GdnCoreCuda, NullStatesMeanZeroAndEveryTilingAgrees) {
  SKIP_WITHOUT_GPU();
  Problem p = make_problem(rng, 1, 150, 2);
  Problem zero = p;
  std::fill(zero.S_in.begin(), zero.S_in.end(), 0.0);
  std::fill(zero.dS_out.begin(), zero.dS_out.end(), 0.0);
  const Ref ref = reference(zero);
  for (const SweepCase& sc : kSweeps) {
    RunOptions null_opt = unsplit(sc.sweep, sc.key_split);
    null_opt.with_S_in = null_opt.with_dS_out = false;
    const Gpu null_states = run_gpu(p, null_opt);
    for (auto [name, err] : errors(null_states, ref)) EXPECT_LE(err, tolerance(name)) << name << ", " << sc.name;
    const bool rows = sc.sweep == GdnCudaConfig::kRowSweeps;
    for (int tiling : rows ? row_tilings(sc.key_split) : std::vector<int>{16, 32, 64}) {
      RunOptions opt = unsplit(sc.sweep, sc.key_split, rows ? tiling : 0);
      if (!rows) opt.cfg.value_tile = tiling;
      const Gpu gpu = run_gpu(zero, opt);
      SCOPED_TRACE(std::string(sc.name) + (rows ? ", warps per block " : ", value tile ") + std::to_string(tiling));
      EXPECT_TRUE(bitwise_equal(gpu.raw_o, null_states.raw_o) && bitwise_equal(gpu.S_out, null_states.S_out));
      EXPECT_TRUE(bitwise_equal(gpu.raw_dq, null_states.raw_dq) && bitwise_equal(gpu.raw_dk, null_states.raw_dk) &&
                  bitwise_equal(gpu.raw_dv, null_states.raw_dv) && bitwise_equal(gpu.dg, null_states.dg) &&
                  bitwise_equal(gpu.dS_in, null_states.dS_in));
    }
  }
  RunOptions split_null = pieces_of(64);  // the split core's null states: 3 pieces
  split_null.with_S_in = split_null.with_dS_out = false;
  for (auto [name, err] : errors(run_gpu(p, split_null), ref)) EXPECT_LE(err, tolerance(name)) << name << ", split";
}

// Runs the pieces [0, cut_1), [cut_1, cut_2), ... as StateFlow chunks: forward passes
// S_out -> S_in left to right, backward dS_in -> dS_out right to left.
Gpu run_split(const Problem& p, const std::vector<int64_t>& cuts, const RunOptions& opt = {}) {
  std::vector<int64_t> edges = {0};
  edges.insert(edges.end(), cuts.begin(), cuts.end());
  edges.push_back(p.d.len);
  const size_t n = edges.size() - 1;
  std::vector<Problem> parts;
  for (size_t i = 0; i < n; ++i) parts.push_back(slice(p, edges[i], edges[i + 1]));
  std::vector<Gpu> out(n);
  for (size_t i = 0; i < n; ++i) {  // forward chain (the backward results of this pass are discarded)
    if (i > 0) parts[i].S_in = out[i - 1].S_out;
    out[i] = run_gpu(parts[i], opt);
  }
  for (size_t i = n; i-- > 0;) {  // backward chain
    if (i + 1 < n) parts[i].dS_out = out[i + 1].dS_in;
    out[i] = run_gpu(parts[i], opt);
  }
  Gpu all;
  for (int64_t b = 0; b < p.d.batch; ++b)  // re-assemble [B, T, H, *] from the pieces
    for (size_t i = 0; i < n; ++i) {
      const int64_t len = parts[i].d.len, H = p.d.heads;
      auto append = [&](Vec& dst, const Vec& src, int64_t w) {
        dst.insert(dst.end(), src.begin() + b * len * H * w, src.begin() + (b + 1) * len * H * w);
      };
      auto append_raw = [&](std::vector<bf16>& dst, const std::vector<bf16>& src, int64_t w) {
        dst.insert(dst.end(), src.begin() + b * len * H * w, src.begin() + (b + 1) * len * H * w);
      };
      append(all.o, out[i].o, DV), append(all.dq, out[i].dq, DK), append(all.dk, out[i].dk, DK);
      append(all.dv, out[i].dv, DV), append(all.dbeta, out[i].dbeta, 1), append(all.dg, out[i].dg, 1);
      append_raw(all.raw_o, out[i].raw_o, DV), append_raw(all.raw_dq, out[i].raw_dq, DK);
      append_raw(all.raw_dk, out[i].raw_dk, DK), append_raw(all.raw_dv, out[i].raw_dv, DV);
    }
  // Forward state comes from the last piece's forward, dS_in from the first piece's backward.
  all.S_out = out[n - 1].S_out, all.dS_in = out[0].dS_in;
  return all;
}

void expect_bitwise_equal(const Gpu& got, const Gpu& want) {
  EXPECT_TRUE(bitwise_equal(got.raw_o, want.raw_o)) << "o";
  EXPECT_TRUE(bitwise_equal(got.S_out, want.S_out)) << "S_out";
  EXPECT_TRUE(bitwise_equal(got.raw_dq, want.raw_dq)) << "dq";
  EXPECT_TRUE(bitwise_equal(got.raw_dk, want.raw_dk)) << "dk";
  EXPECT_TRUE(bitwise_equal(got.raw_dv, want.raw_dv)) << "dv";
  EXPECT_TRUE(bitwise_equal(got.dbeta, want.dbeta)) << "dbeta";
  EXPECT_TRUE(bitwise_equal(got.dg, want.dg)) << "dg";
  EXPECT_TRUE(bitwise_equal(got.dS_in, want.dS_in)) << "dS_in";
}

TEST_F(GdnCoreCuda, UnsplitCoreSplitAtMultiplesOfCIsBitwiseNeutral) {
  SKIP_WITHOUT_GPU();
  const Problem p = make_problem(rng, 2, 300, 2);
  for (const SweepCase& sc : kSweeps) {
    SCOPED_TRACE(sc.name);
    const RunOptions opt = unsplit(sc.sweep, sc.key_split);
    expect_bitwise_equal(run_split(p, {128, 192}, opt), run_gpu(p, opt));
  }
}

// The split core with 128-token pieces (2 sub-chunks): a call cut at multiples of 128 repeats
// the uncut call's fold, so every output is bitwise the same; also for a null S_in / dS_out.
TEST_F(GdnCoreCuda, SplitCoreSplitAtMultiplesOfThePieceIsBitwiseNeutral) {
  SKIP_WITHOUT_GPU();
  const Problem p = make_problem(rng, 2, 700, 2);  // 5 whole pieces and one of 60 tokens
  const RunOptions opt = pieces_of(128);
  expect_bitwise_equal(run_split(p, {128, 512, 640}, opt), run_gpu(p, opt));
  RunOptions null_opt = opt;
  null_opt.with_S_in = null_opt.with_dS_out = false;
  const Gpu whole_null = run_gpu(p, null_opt);
  // Two calls cut at 256: the first has no S_in, the second no dS_out.
  Problem first = slice(p, 0, 256), second = slice(p, 256, 700);
  RunOptions first_opt = opt, second_opt = opt;
  first_opt.with_S_in = false, second_opt.with_dS_out = false;
  const Gpu f1 = run_gpu(first, first_opt);
  second.S_in = f1.S_out;
  const Gpu s2 = run_gpu(second, second_opt);
  EXPECT_TRUE(bitwise_equal(s2.S_out, whole_null.S_out)) << "S_out, null S_in";
  first.dS_out = s2.dS_in;
  const Gpu b1 = run_gpu(first, first_opt);
  EXPECT_TRUE(bitwise_equal(b1.dS_in, whole_null.dS_in)) << "dS_in, null dS_out";
}

// Against the float64 recurrence on lengths that divide neither the piece nor C, with decays
// near 1 (g ~ -1e-3 per token) and near 0 (g ~ -20), for several piece lengths and tiles; the
// split core stays within the band the unsplit core is held to.
TEST_F(GdnCoreCuda, SplitCoreMatchesFloat64RecurrenceIncludingExtremeDecays) {
  SKIP_WITHOUT_GPU();
  for (const std::string decay : {"layer", "near 1", "near 0"}) {
    Problem p = make_problem(rng, 1, 459, 3);  // 7 sub-chunks + 11 tokens
    for (double& g : p.g) {
      if (decay == "near 1") g = double(float(-1e-3 * rng.uniform(0, 1)));
      if (decay == "near 0") g = double(float(-20 * rng.uniform(0.5, 1)));
    }
    const Ref ref = reference(p);
    // Whole-tensor (2-norm) errors for the 2x comparison, the worst entry for the band.
    const auto e_unsplit = errors(run_gpu(p, unsplit()), ref, rms_rel_err<double, double>);
    for (auto [len, tile] : {std::pair{64, 32}, {128, 64}, {192, 128}, {512, 0}}) {
      const Gpu gpu = run_gpu(p, pieces_of(len, tile));
      EXPECT_FALSE(has_nan(gpu.o) || has_nan(gpu.dq) || has_nan(gpu.dk) || has_nan(gpu.dS_in) || has_nan(gpu.dg));
      const auto e_max = errors(gpu, ref), e = errors(gpu, ref, rms_rel_err<double, double>);
      for (size_t i = 0; i < e.size(); ++i) {
        const std::string name = e[i].first;
        SCOPED_TRACE("decay " + decay + ", piece " + std::to_string(len) + ", output " + name);
        std::printf("  %-6s %-6s piece %3d: max rel err %.3e, rms %.3e (unsplit rms %.3e)\n", decay.c_str(),
                    name.c_str(), len, e_max[i].second, e[i].second, e_unsplit[i].second);
        // With g ~ -20 a token's decay gradient is a sum of terms e^-20 apart: its bf16 error
        // is of its own size in both cores (measured 0.9e-2 to 3.0e-2 worst, 3e-2 to 8e-2
        // rms), so there it is held to the 2x rule only.
        if (!(decay == "near 0" && name == "dg")) EXPECT_LE(e_max[i].second, tolerance(name));
        EXPECT_LE(e[i].second, 2 * e_unsplit[i].second + 1e-6);
      }
    }
  }
}

TEST_F(GdnCoreCuda, SplitCoreIsTheSameForEveryPieceTile) {
  SKIP_WITHOUT_GPU();
  const Problem p = make_problem(rng, 2, 390, 2);
  const Gpu a = run_gpu(p, pieces_of(128, 32));
  for (int tile : {64, 128}) {
    SCOPED_TRACE("tile " + std::to_string(tile));
    expect_bitwise_equal(run_gpu(p, pieces_of(128, tile)), a);
  }
}

TEST_F(GdnCoreCuda, SplitElsewhereStaysWithinTwiceTheUnsplitError) {
  SKIP_WITHOUT_GPU();
  const Problem p = make_problem(rng, 1, 260, 2);
  const Ref ref = reference(p);
  // Whole-tensor (2-norm) errors: the worst entry of a 260-token run is one token's luck.
  const auto e_whole = errors(run_gpu(p), ref, rms_rel_err<double, double>);
  const auto e_split = errors(run_split(p, {37, 42, 150}), ref, rms_rel_err<double, double>);  // 37, 5, 108, 110
  for (size_t i = 0; i < e_whole.size(); ++i) {
    const std::string name = e_whole[i].first;
    std::printf("  %-6s unsplit %.3e  split %.3e\n", name.c_str(), e_whole[i].second, e_split[i].second);
    // Known gap: the per-token gate gradients (dg, dbeta) of pieces as short as 5 tokens were
    // measured up to 3x the unsplit error (both far inside the bf16 band); the model-level test
    // (ModelCuda.ChunksElsewhereStayWithinTwiceTheUnchunkedError) holds the 2x rule for the
    // parameters' gradients they feed. Here they are held to the band.
    if (name == "dg" || name == "dbeta")
      EXPECT_LE(e_split[i].second, tolerance(name)) << name;
    else
      EXPECT_LE(e_split[i].second, 2 * e_whole[i].second + 1e-6) << name;
  }
}

// B4 streams the state and its gradient in slabs of value rows; every slab height adds the
// same products in the same order, so the gradients are the same bits, and they stay in the
// float64 band (batch 2 x 3 heads, a short last sub-chunk).
TEST_F(GdnCoreCuda, B4GivesTheSameBitsForEverySlabHeight) {
  SKIP_WITHOUT_GPU();
  const Problem p = make_problem(rng, 2, 333, 3);
  const Ref ref = reference(p);
  const Gpu auto_slab = run_gpu(p, unsplit());
  for (auto [name, err] : errors(auto_slab, ref)) EXPECT_LE(err, tolerance(name)) << name;
  for (int slab : {16, 32, 64}) {
    SCOPED_TRACE("slab of " + std::to_string(slab) + " rows");
    RunOptions opt = unsplit();
    opt.cfg.b4_slab = slab;
    const Gpu gpu = run_gpu(p, opt);
    EXPECT_TRUE(bitwise_equal(gpu.raw_dq, auto_slab.raw_dq) && bitwise_equal(gpu.raw_dk, auto_slab.raw_dk) &&
                bitwise_equal(gpu.raw_dv, auto_slab.raw_dv))
        << "dq, dk, dv";
    EXPECT_TRUE(bitwise_equal(gpu.dbeta, auto_slab.dbeta) && bitwise_equal(gpu.dg, auto_slab.dg)) << "dbeta, dg";
  }
}

// B4 on wgmma (each warpgroup's products read from shared memory) against the mma.sync kernel:
// the same products over the same 16-wide K steps, and on the H200 the tensor cores' fp32 sums
// agree too, so every output is the same bits; wgmma's B4 stays in the float64 band and gives the
// same bits at every slab height.
TEST_F(GdnCoreCuda, B4OnWgmmaGivesTheMmaSyncBits) {
  SKIP_WITHOUT_GPU();
  if (!gdn_cuda_wgmma_available()) GTEST_SKIP() << "B4 on wgmma needs a compute capability 9.x GPU and sm_90a code";
  const Problem p = make_problem(rng, 2, 333, 3);
  const Ref ref = reference(p);
  RunOptions mma = unsplit(), wg = unsplit();
  mma.cfg.b4_mma = GdnCudaConfig::kMmaSync;
  wg.cfg.b4_mma = GdnCudaConfig::kWgmma;
  const Gpu old_b4 = run_gpu(p, mma);
  for (int slab : {16, 32, 64}) {
    SCOPED_TRACE("wgmma, slab of " + std::to_string(slab) + " rows");
    wg.cfg.b4_slab = slab;
    const Gpu new_b4 = run_gpu(p, wg);
    expect_bitwise_equal(new_b4, old_b4);
    for (auto [name, err] : errors(new_b4, ref)) EXPECT_LE(err, tolerance(name)) << name;
  }
}

// B4 with a deep ring (four slots of state slabs, 16 or 32 rows a step, dV_new loaded for the
// second pass; its early slabs or not; its lean epilogues) against the two-slot B4: the same products
// and epilogue operations, so every output and gradient is the same bits, recomputing T and from a
// kept T (lean: also in calls cut at 128 and 192); and a short last sub-chunk stays in the float64 band.
TEST_F(GdnCoreCuda, B4DeepRingGivesTheTwoSlotBits) {
  SKIP_WITHOUT_GPU();
  const Problem p = make_problem(rng, 2, 333, 3);
  const Ref ref = reference(p);
  for (bool keep_T : {false, true}) {
    SCOPED_TRACE(keep_T ? "T kept" : "T recomputed");
    RunOptions two = unsplit(), deep = unsplit();
    two.keep_T = deep.keep_T = keep_T;
    two.cfg.b4_mma = deep.cfg.b4_mma = GdnCudaConfig::kMmaSync;
    two.cfg.tile_copies = deep.cfg.tile_copies = GdnCudaConfig::kCopyPlans;
    two.cfg.b4_kernel = GdnCudaConfig::kB4TwoSlots;
    const Gpu old_b4 = run_gpu(p, two);
    for (int kernel : {GdnCudaConfig::kB4DeepRing, GdnCudaConfig::kB4EarlySlabs, GdnCudaConfig::kB4Lean})
      for (int rows : {16, 32}) {
        SCOPED_TRACE(std::to_string(rows) + " rows a step" + (kernel == GdnCudaConfig::kB4EarlySlabs ? ", early slabs"
                                                              : kernel == GdnCudaConfig::kB4Lean   ? ", lean"
                                                                                                   : ""));
        deep.cfg.b4_kernel = kernel;
        deep.cfg.b4_slab = rows;
        const Gpu new_b4 = run_gpu(p, deep);
        expect_bitwise_equal(new_b4, old_b4);
        for (auto [name, err] : errors(new_b4, ref)) EXPECT_LE(err, tolerance(name)) << name;
        if (kernel == GdnCudaConfig::kB4Lean && rows == 16) {
          SCOPED_TRACE("lean, cut at 128 and 192");
          expect_bitwise_equal(run_split(p, {128, 192}, deep), old_b4);
        }
      }
  }
}

// Tile copies through each thread's precomputed plan (the lever tile_copies) land the same bytes
// as the generic loop: every output and gradient the same bits, recomputing T and from a kept T,
// with either of B4's products where wgmma can run.
TEST_F(GdnCoreCuda, TileCopyPlansGiveTheLoopsBits) {
  SKIP_WITHOUT_GPU();
  const Problem p = make_problem(rng, 2, 333, 3);
  for (int mma : {GdnCudaConfig::kMmaSync, GdnCudaConfig::kWgmma}) {
    if (mma == GdnCudaConfig::kWgmma && !gdn_cuda_wgmma_available()) continue;
    for (bool keep_T : {false, true}) {
      SCOPED_TRACE(std::string(mma == GdnCudaConfig::kWgmma ? "wgmma" : "mma.sync") + (keep_T ? ", T kept" : ""));
      RunOptions loops = unsplit(), plans = unsplit();
      loops.keep_T = plans.keep_T = keep_T;
      loops.cfg.b4_mma = plans.cfg.b4_mma = mma;
      loops.cfg.tile_copies = GdnCudaConfig::kCopyLoops;
      plans.cfg.tile_copies = GdnCudaConfig::kCopyPlans;
      expect_bitwise_equal(run_gpu(p, plans), run_gpu(p, loops));
    }
  }
}

TEST_F(GdnCoreCuda, RunsAreBitwiseRepeatable) {
  SKIP_WITHOUT_GPU();
  const Problem p = make_problem(rng, 1, 517, 4);
  const Gpu a = run_gpu(p), b = run_gpu(p);
  EXPECT_TRUE(bitwise_equal(a.raw_o, b.raw_o) && bitwise_equal(a.S_out, b.S_out)) << "forward";
  EXPECT_TRUE(bitwise_equal(a.raw_dq, b.raw_dq) && bitwise_equal(a.raw_dk, b.raw_dk) &&
              bitwise_equal(a.raw_dv, b.raw_dv))
      << "dq, dk, dv";
  EXPECT_TRUE(bitwise_equal(a.dbeta, b.dbeta) && bitwise_equal(a.dg, b.dg) && bitwise_equal(a.dS_in, b.dS_in))
      << "dbeta, dg, dS_in";
}

TEST_F(GdnCoreCuda, BackwardFromSavedForwardEqualsRecompute) {
  SKIP_WITHOUT_GPU();
  const Problem p = make_problem(rng, 2, 333, 3);
  const Ref ref = reference(p);
  for (const SweepCase& sc : kSweeps) {
    SCOPED_TRACE(sc.name);
    RunOptions saved = unsplit(sc.sweep, sc.key_split);
    saved.cfg.saved_forward = true;
    const Gpu b = run_gpu(p, saved);
    expect_bitwise_equal(b, run_gpu(p, unsplit(sc.sweep, sc.key_split)));
    for (auto [name, err] : errors(b, ref)) EXPECT_LE(err, tolerance(name)) << name << ", saved forward";
  }
}

// The quarter sweeps' copy warp (GdnCudaConfig::sweep_copy_warp) only changes which warp issues
// the tile copies, and its multicast to clusters of 4 or 8 blocks (sweep_multicast) only where
// the shared tiles' bytes come from: outputs and every gradient bitwise those of the sweep warps
// issuing the copies, for the forward, the backward that re-runs the forward beside its own
// (forward and reverse clusters in one grid) and the saved-forward backward, with a short last
// sub-chunk (its K and Q rows zero-filled), two sequences and carried states.
TEST_F(GdnCoreCuda, QuarterSweepCopyWarpGivesTheSameBits) {
  SKIP_WITHOUT_GPU();
  const Problem p = make_problem(rng, 2, 333, 3);
  for (bool saved : {false, true}) {
    SCOPED_TRACE(saved ? "saved forward" : "recomputing backward");
    RunOptions own = unsplit(GdnCudaConfig::kRowSweeps, 4, 4);  // one row group per block
    own.cfg.saved_forward = saved;
    own.cfg.sweep_copy_warp = -1;
    const Gpu base = run_gpu(p, own);
    for (int multicast : {-1, 4, 8}) {
      SCOPED_TRACE("copy warp, sweep_multicast " + std::to_string(multicast));
      RunOptions copy_warp = own;
      copy_warp.cfg.sweep_copy_warp = 1;
      copy_warp.cfg.sweep_multicast = multicast;
      expect_bitwise_equal(run_gpu(p, copy_warp), base);
    }
  }
}

// Whole-tile copies by lines (sweep_copy_lines; by the copy warp, or shared by the sweep warps
// without it) and ST with four sub-chunks of tiles in flight (sweep_stages 4) put the same bytes in
// the same buffers, so the forward's outputs and the backward from its kept sweep (B3 alone), from
// the saved forward and overlapped with B4 are bitwise those of the predicated copies three deep;
// with a short last sub-chunk (its tiles take the predicated copies), two sequences, a poisoned
// workspace and cuts at 128 and 192.
TEST_F(GdnCoreCuda, CopyWarpLinesAndDeeperForwardCopiesGiveTheSameBits) {
  SKIP_WITHOUT_GPU();
  const Problem p = make_problem(rng, 2, 333, 3);  // 6 sub-chunks, the last of 13 tokens
  for (int copy_warp : {1, -1}) {
    SCOPED_TRACE("sweep_copy_warp " + std::to_string(copy_warp));
    RunOptions old = unsplit(GdnCudaConfig::kRowSweeps, 4, 4);
    old.cfg.sweep_copy_warp = copy_warp, old.cfg.sweep_multicast = -1, old.cfg.sweep_stages = 3;
    old.cfg.sweep_copy_lines = -1, old.cfg.overlap = -1;
    old.keep_T = old.keep_sweep = true;
    const Gpu want = run_gpu(p, old);
    RunOptions saved = old;
    saved.keep_T = saved.keep_sweep = false, saved.cfg.saved_forward = true;
    const Gpu want_saved = run_gpu(p, saved);
    for (auto [stages, lines] : {std::pair{3, 1}, {4, -1}, {4, 1}}) {
      SCOPED_TRACE("sweep_stages " + std::to_string(stages) + ", sweep_copy_lines " + std::to_string(lines));
      RunOptions now = old;
      now.cfg.sweep_stages = stages, now.cfg.sweep_copy_lines = lines;
      now.poison_workspace = true;
      expect_bitwise_equal(run_gpu(p, now), want);
      expect_bitwise_equal(run_split(p, {128, 192}, now), want);
      RunOptions overlapped = now;
      overlapped.cfg.overlap = 1, overlapped.cfg.overlap_segment = 2;
      expect_bitwise_equal(run_gpu(p, overlapped), want);
      RunOptions now_saved = saved;
      now_saved.cfg.sweep_stages = stages, now_saved.cfg.sweep_copy_lines = lines;
      expect_bitwise_equal(run_gpu(p, now_saved), want_saved);
    }
  }
  RunOptions multicast = unsplit(GdnCudaConfig::kRowSweeps, 4, 4);
  multicast.cfg.sweep_copy_warp = 1, multicast.cfg.sweep_multicast = 8, multicast.cfg.sweep_stages = 4;
  EXPECT_THROW(run_gpu(p, multicast), Error);  // four stages only with per-block copies
}

// B3 overlapped with B4 (GdnCudaConfig::overlap) changes only the schedule, so outputs and every
// gradient are bitwise the sequential ones: the backward that re-runs the forward sweep beside B3
// (recomputing T, or from a kept T: B4 waits for both sweeps) and the backward from a kept sweep
// or the saved forward (B4 waits for the reverse sweep alone); with one row group per block (copy
// warp on and off) and two; segments of 1, 2 and
// 3 sub-chunks (the last one short) on 1, 2 and 3 streams, a short last sub-chunk, two sequences
// and carried states, the workspace poisoned first. Calls cut at multiples of 64 are bitwise the sequential one call.
TEST_F(GdnCoreCuda, OverlapGivesTheSequentialBits) {
  SKIP_WITHOUT_GPU();
  const Problem p = make_problem(rng, 2, 333, 3);  // 6 sub-chunks, the last of 13 tokens
  struct Reuse {
    const char* name;
    bool keep_T, keep_sweep, saved;
  };
  const Reuse reuses[] = {{"recomputing backward", false, false, false},
                          {"T kept", true, false, false},
                          {"T and sweep kept", true, true, false},
                          {"saved forward", false, false, true}};
  // Row groups and copies: the defaults (two row groups a block when overlapped), one row group with
  // the sweep warps copying, or with a copy warp that counts the segments (multicasting with the
  // untried lever sweep_multicast on), and two row groups asked for.
  for (auto [warps, copy_warp] : {std::pair{0, 0}, {4, -1}, {4, 1}, {8, 0}})
    for (const Reuse& reuse : reuses) {
      SCOPED_TRACE(std::string(reuse.name) + ", sweep_warps " + std::to_string(warps) + ", sweep_copy_warp " +
                   std::to_string(copy_warp));
      RunOptions seq = unsplit(GdnCudaConfig::kRowSweeps, 4, warps);
      seq.cfg.sweep_copy_warp = copy_warp;
      seq.keep_T = reuse.keep_T, seq.keep_sweep = reuse.keep_sweep, seq.cfg.saved_forward = reuse.saved;
      seq.poison_workspace = true;
      seq.cfg.overlap = -1;
      const Gpu want = run_gpu(p, seq);
      for (int segment : {1, 2, 3}) {
        const int streams = segment;  // launches on 1, 2 or 3 streams
        SCOPED_TRACE("segments of " + std::to_string(segment) + " on " + std::to_string(streams) + " streams");
        RunOptions on = seq;
        on.cfg.overlap = 1, on.cfg.overlap_segment = segment, on.cfg.overlap_streams = streams;
        expect_bitwise_equal(run_gpu(p, on), want);
        if (segment == 1 && !reuse.saved) {
          SCOPED_TRACE("cut at 128 and 192");
          expect_bitwise_equal(run_split(p, {128, 192}, on), want);
        }
      }
    }
}

// Long enough that the consumers run while the sweeps go on (79 segments of 64 tokens): bitwise
// the sequential calls, one call and calls cut at 2048 (the model's rule), T kept as the layer keeps it.
TEST_F(GdnCoreCuda, OverlapOfLongCallsGivesTheSequentialBits) {
  SKIP_WITHOUT_GPU();
  const Problem p = make_problem(rng, 1, 5000, 4);
  for (bool keep_sweep : {false, true}) {
    SCOPED_TRACE(keep_sweep ? "T and sweep kept" : "T kept");
    RunOptions seq = unsplit(GdnCudaConfig::kRowSweeps, 4);
    seq.keep_T = true, seq.keep_sweep = keep_sweep, seq.poison_workspace = true;
    seq.cfg.overlap = -1;
    RunOptions on = seq;
    on.cfg.overlap = 1, on.cfg.overlap_segment = 1;
    const Gpu want = run_gpu(p, seq);
    expect_bitwise_equal(run_gpu(p, on), want);
    expect_bitwise_equal(run_split(p, {2048, 4096}, on), want);
  }
}

// Which backward calls overlap: the lever (overlap = 0) the ones that read a kept forward sweep or
// the saved forward, not the ones that re-run it beside B3 (measured no faster); overlap = 1 both,
// -1 neither; and none shorter than two segments (the pipeline's 2048-token chunks), nor other
// sweeps.
TEST_F(GdnCoreCuda, TheOverlapRunsWhereItWasMeasuredFaster) {
  SKIP_WITHOUT_GPU();
  GdnDims d;
  d.batch = 1, d.heads = 16, d.len = 32768, d.dk = DK, d.dv = DV, d.block = C;
  GdnCudaConfig kept_T, kept_sweep, saved;
  kept_T.kept_T = kept_sweep.kept_T = kept_sweep.kept_sweep = true;
  saved.saved_forward = true;
  const bool lever = !lever_off("core_overlap");
  EXPECT_FALSE(gdn_cuda_overlaps_backward(d, kept_T));
  EXPECT_EQ(gdn_cuda_overlaps_backward(d, kept_sweep), lever);
  EXPECT_EQ(gdn_cuda_overlaps_backward(d, saved), lever);
  for (GdnCudaConfig* cfg : {&kept_T, &kept_sweep, &saved}) cfg->overlap = 1;
  EXPECT_TRUE(gdn_cuda_overlaps_backward(d, kept_T));
  EXPECT_TRUE(gdn_cuda_overlaps_backward(d, kept_sweep));
  GdnDims chunk = d;
  chunk.len = 2048;  // 32 sub-chunks: one segment of 64
  EXPECT_FALSE(gdn_cuda_overlaps_backward(chunk, kept_sweep));
  kept_sweep.overlap_segment = 16;
  EXPECT_TRUE(gdn_cuda_overlaps_backward(chunk, kept_sweep));
  kept_sweep.overlap = -1;
  EXPECT_FALSE(gdn_cuda_overlaps_backward(d, kept_sweep));
  GdnCudaConfig split = saved;
  split.overlap = 0, split.piece_len = 512;  // the lever passes over the split core's sweeps
  EXPECT_FALSE(gdn_cuda_overlaps_backward(d, split));
}

// B1 from a kept T (the layer's default): outputs and every gradient bitwise those of the
// backward that recomputes T, for each unsplit sweep and the split core, with a short last
// sub-chunk and the workspace poisoned between the calls (nothing but T may survive).
TEST_F(GdnCoreCuda, BackwardFromKeptTEqualsRecomputeBitwise) {
  SKIP_WITHOUT_GPU();
  const Problem p = make_problem(rng, 2, 333, 3);
  const Ref ref = reference(p);
  std::vector<std::pair<std::string, RunOptions>> cases;
  for (const SweepCase& sc : kSweeps) cases.push_back({sc.name, unsplit(sc.sweep, sc.key_split)});
  cases.push_back({"pieces of 128", pieces_of(128)});
  for (auto [name, opt] : cases) {
    SCOPED_TRACE(name);
    RunOptions kept = opt;
    kept.keep_T = true;
    const Gpu b = run_gpu(p, kept);
    expect_bitwise_equal(b, run_gpu(p, opt));
    for (auto [err_name, err] : errors(b, ref)) EXPECT_LE(err, tolerance(err_name)) << err_name << ", kept T";
  }
}

// The forward sweep's V_new and entering states kept in a buffer of their own (the layer's
// gdn.keep_sweep), with T kept as the layer keeps it: outputs and every gradient bitwise those
// of the backward that re-runs the forward sweep, for each unsplit sweep and the split core
// (which re-runs its piece sweeps anyway), with a short last sub-chunk and the workspace
// poisoned between the calls; and calls cut at multiples of C, each chunk keeping its own,
// bitwise the one call.
TEST_F(GdnCoreCuda, BackwardFromKeptSweepEqualsRecomputeBitwise) {
  SKIP_WITHOUT_GPU();
  const Problem p = make_problem(rng, 2, 333, 3);
  const Ref ref = reference(p);
  std::vector<std::pair<std::string, RunOptions>> cases;
  for (const SweepCase& sc : kSweeps) cases.push_back({sc.name, unsplit(sc.sweep, sc.key_split)});
  cases.push_back({"quarter sweeps, 8 warps", unsplit(GdnCudaConfig::kRowSweeps, 4, 8)});
  cases.push_back({"pieces of 128", pieces_of(128)});
  for (auto [name, opt] : cases) {
    SCOPED_TRACE(name);
    RunOptions kept = opt;
    kept.keep_T = kept.keep_sweep = true;
    const Gpu b = run_gpu(p, kept);
    expect_bitwise_equal(b, run_gpu(p, opt));
    for (auto [err_name, err] : errors(b, ref)) EXPECT_LE(err, tolerance(err_name)) << err_name << ", kept sweep";
    if (opt.cfg.piece_len == GdnCudaConfig::kUnsplit) {
      SCOPED_TRACE("cut at 64 and 192");
      expect_bitwise_equal(run_split(p, {64, 192}, kept), b);
    }
  }
}

// A kept sweep buffer holds G (4 bytes per token), W (2 dk), V_new (2 dv) and the entering states
// (2 dv dk per sub-chunk), 1028 bytes per token and head at 64-token multiples, and the workspace
// has that much less room. Host code: runs without a GPU.
TEST_F(GdnCoreCuda, KeptSweepBytesComeOutOfTheWorkspace) {
  GdnDims d;
  d.batch = 2, d.heads = 3, d.len = 4096, d.dk = DK, d.dv = DV, d.block = C;
  EXPECT_EQ(gdn_cuda_kept_sweep_bytes(d), size_t(1028) * 2 * 3 * 4096);
  GdnCudaConfig kept;
  kept.sweep_buffer = &kept;  // only its presence matters to the sizes
  EXPECT_EQ(gdn_cuda_workspace_bytes(d) - gdn_cuda_workspace_bytes(d, kept), gdn_cuda_kept_sweep_bytes(d));
  d.len = 100;  // two sub-chunks, the second short: sized for whole sub-chunks
  // G, W and V_new of 128 token rows, 2 states
  EXPECT_EQ(gdn_cuda_kept_sweep_bytes(d), size_t(2) * 3 * (128 * 4 + 2 * 128 * 128 * 2 + 2 * 128 * 128 * 2));
}

// T = (I + A)^-1 of every sub-chunk as the forward keeps it (bf16 [batch][heads][sub-chunks][C][C]),
// with Pre inverting the way `pre` asks (GdnCudaConfig::pre).
std::vector<bf16> kept_T_of(const Problem& p, int pre) {
  const GdnDims& d = p.d;
  Dev<bf16> q(p.q), k(p.k), v(p.v), o(p.v.size()), T(gdn_cuda_kept_T_bytes(d) / sizeof(bf16));
  Dev<float> beta(p.beta), g(p.g);
  Dev<char> ws(gdn_cuda_workspace_bytes(d));
  GdnCudaConfig cfg;
  cfg.T_buffer = T.p, cfg.pre = pre;
  gdn_chunk_forward_cuda(d, q.p, k.p, v.p, beta.p, g.p, nullptr, o.p, nullptr, ws.p, nullptr, cfg);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return T.raw();
}

// The same T in float64 from the same rounded inputs (MATH.md section 3): per sub-chunk, A[r][c] =
// beta_r (k_r . k_c) exp(G_r - G_c) for c < r with G the sub-chunk's cumsum of g, then forward
// substitution; padded rows of a short last sub-chunk are rows of the identity, as on the GPU.
Vec float64_T(const Problem& p) {
  const GdnDims& d = p.d;
  const int64_t NS = (d.len + C - 1) / C;
  Vec out;
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads; ++h)
      for (int64_t n = 0; n < NS; ++n) {
        const int64_t nv = std::min(C, d.len - n * C);
        auto row = [&](int64_t r) { return ((b * d.len + n * C + r) * d.heads + h); };
        std::vector<double> G(C, 0.0), A(C * C, 0.0), T(C * C, 0.0);
        for (int64_t r = 0; r < nv; ++r) G[r] = (r ? G[r - 1] : 0.0) + p.g[row(r)];
        for (int64_t r = 0; r < nv; ++r)
          for (int64_t c = 0; c < r; ++c) {
            double kk = 0;
            for (int64_t e = 0; e < DK; ++e) kk += p.k[row(r) * DK + e] * p.k[row(c) * DK + e];
            A[r * C + c] = p.beta[row(r)] * kk * std::exp(G[r] - G[c]);
          }
        for (int64_t j = 0; j < C; ++j)  // column j of T: (I + A) x = e_j
          for (int64_t r = j; r < C; ++r) {
            double s = r == j ? 1.0 : 0.0;
            for (int64_t c = j; c < r; ++c) s -= A[r * C + c] * T[c * C + j];
            T[r * C + j] = s;
          }
        out.insert(out.end(), T.begin(), T.end());
      }
  return out;
}

// Pre on tensor cores (GdnCudaConfig::kPreMma, the lever pre_mma) against the scalar Pre and the
// float64 inverse: T's diagonal blocks are the same bits (the same substitution), the whole T
// as close to float64 as the scalar T (both are the exact inverse rounded to bf16, up to the
// split products' ~2^-16), and every output and gradient in the float64 band and within 2x the
// scalar Pre's whole-tensor error, with the layer's decays and decays near 1 and near 0, a
// short last sub-chunk, recomputing T and from a kept T.
TEST_F(GdnCoreCuda, PreOnTensorCoresMatchesFloat64AsTheScalarPreDoes) {
  SKIP_WITHOUT_GPU();
  for (const std::string decay : {"layer", "near 1", "near 0"}) {
    SCOPED_TRACE("decay " + decay);
    Problem p = make_problem(rng, 2, 331, 3);  // 5 sub-chunks + 11 tokens
    for (double& g : p.g) {
      if (decay == "near 1") g = double(float(-1e-3 * rng.uniform(0, 1)));
      if (decay == "near 0") g = double(float(-20 * rng.uniform(0.5, 1)));
    }
    const std::vector<bf16> T_mma = kept_T_of(p, GdnCudaConfig::kPreMma);
    const std::vector<bf16> T_scalar = kept_T_of(p, GdnCudaConfig::kPreScalar);
    const Vec T64 = float64_T(p);
    Vec t_mma, t_scalar;
    bool diagonal_same = true;
    for (size_t e = 0; e < T64.size(); ++e) {
      t_mma.push_back(double(float(T_mma[e]))), t_scalar.push_back(double(float(T_scalar[e])));
      const size_t r = e / C % C, c = e % C;
      if (r / 16 == c / 16) diagonal_same &= std::memcmp(&T_mma[e], &T_scalar[e], sizeof(bf16)) == 0;
    }
    EXPECT_TRUE(diagonal_same) << "T's diagonal blocks";
    EXPECT_LE(rms_rel_err(t_mma, T64), 1.1 * rms_rel_err(t_scalar, T64) + 1e-7);
    EXPECT_LE(rel_err(t_mma, T64), 2 * rel_err(t_scalar, T64) + 1e-7);
    EXPECT_LE(rel_err(t_mma, T64), 1.0 / 256) << "bf16 rounding of T";

    const Ref ref = reference(p);
    for (bool keep_T : {false, true}) {
      SCOPED_TRACE(keep_T ? "T kept" : "T recomputed");
      RunOptions mma = unsplit(), scalar = unsplit();
      mma.keep_T = scalar.keep_T = keep_T;
      mma.cfg.pre = GdnCudaConfig::kPreMma, scalar.cfg.pre = GdnCudaConfig::kPreScalar;
      expect_band_and_twice(run_gpu(p, mma), ref, errors(run_gpu(p, scalar), ref, rms_rel_err<double, double>),
                            decay == "near 0");
    }
  }
}

// W and U from a given T are the same arithmetic in both Pre kernels: a backward from a T the
// scalar Pre kept gives the same bits with B1 on the tensor-core kernel, and a backward from a T
// the tensor-core Pre kept the same bits with B1 on the scalar kernel (batch 2 x 3 heads, a short
// last sub-chunk); and the tensor-core Pre's backward from its kept T equals its recompute.
TEST_F(GdnCoreCuda, PreOnTensorCoresFormsWAndUFromAKeptTAsTheScalarPreDoes) {
  SKIP_WITHOUT_GPU();
  const Problem p = make_problem(rng, 2, 333, 3);
  for (int forward : {GdnCudaConfig::kPreScalar, GdnCudaConfig::kPreMma}) {
    SCOPED_TRACE(forward == GdnCudaConfig::kPreMma ? "T from the tensor-core Pre" : "T from the scalar Pre");
    RunOptions opt = unsplit();
    opt.keep_T = true;
    opt.cfg.pre = forward;
    opt.backward_pre = GdnCudaConfig::kPreScalar;
    const Gpu scalar_b1 = run_gpu(p, opt);
    opt.backward_pre = GdnCudaConfig::kPreMma;
    expect_bitwise_equal(run_gpu(p, opt), scalar_b1);
  }
  RunOptions recompute = unsplit(), kept = unsplit();
  recompute.cfg.pre = kept.cfg.pre = GdnCudaConfig::kPreMma;
  kept.keep_T = true;
  expect_bitwise_equal(run_gpu(p, kept), run_gpu(p, recompute));
}

// Pre on tensor cores keeps the unsplit core's chunk rule: splits at multiples of C are bitwise neutral.
TEST_F(GdnCoreCuda, PreOnTensorCoresSplitAtMultiplesOfCIsBitwiseNeutral) {
  SKIP_WITHOUT_GPU();
  const Problem p = make_problem(rng, 2, 300, 2);
  RunOptions opt = unsplit();
  opt.cfg.pre = GdnCudaConfig::kPreMma;
  expect_bitwise_equal(run_split(p, {128, 192}, opt), run_gpu(p, opt));
}

// What a forward with T and the sweep kept leaves in those buffers (T; G, W, V_new and the
// entering states), as bytes.
std::pair<std::vector<char>, std::vector<char>> forward_kept_bytes(const Problem& p, GdnCudaConfig cfg) {
  const GdnDims& d = p.d;
  Dev<bf16> q(p.q), k(p.k), v(p.v), o(p.v.size());
  Dev<float> beta(p.beta), g(p.g), S_in(p.S_in), S_out(p.S_in.size());
  Dev<char> kept_T(gdn_cuda_kept_T_bytes(d)), kept_sweep(gdn_cuda_kept_sweep_bytes(d));
  for (auto* x : {&kept_T, &kept_sweep}) EXPECT_EQ(cudaMemset(x->p, 0xff, x->n), cudaSuccess);
  cfg.T_buffer = reinterpret_cast<bf16*>(kept_T.p), cfg.sweep_buffer = kept_sweep.p;
  Dev<char> ws(gdn_cuda_workspace_bytes(d, cfg));
  EXPECT_EQ(cudaMemset(ws.p, 0xff, ws.n), cudaSuccess);
  gdn_chunk_forward_cuda(d, q.p, k.p, v.p, beta.p, g.p, S_in.p, o.p, S_out.p, ws.p, nullptr, cfg);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return {kept_T.raw(), kept_sweep.raw()};
}

// Pre with V loaded late and the lean B2 against Pre on tensor cores and the plain B2: the same T,
// G, W, V_new and entering states from the forward, and every output and gradient the same bits
// recomputing T, from a kept T and from a kept sweep (B2 then runs alone before B3), the workspace
// NaN-poisoned, batch 2 x 3 heads with a short last sub-chunk.
TEST_F(GdnCoreCuda, PreWithVLoadedLateAndLeanB2GiveTheOldBits) {
  SKIP_WITHOUT_GPU();
  const Problem p = make_problem(rng, 2, 333, 3);
  struct Case {
    const char* name;
    int pre, b2;
  };
  using G = GdnCudaConfig;
  const std::vector<Case> cases = {{"late V", G::kPreLateV, G::kB2Plain},
                                   {"lean B2", G::kPreMma, G::kB2Lean},
                                   {"both", G::kPreLateV, G::kB2Lean}};
  RunOptions old = unsplit();
  old.cfg.pre = G::kPreMma, old.cfg.b2 = G::kB2Plain;
  old.poison_workspace = true;
  const auto old_kept = forward_kept_bytes(p, old.cfg);
  for (int kept : {0, 1, 2}) {
    SCOPED_TRACE(kept == 0 ? "recomputing T" : kept == 1 ? "T kept" : "T and the sweep kept");
    RunOptions base = old;
    base.keep_T = kept >= 1, base.keep_sweep = kept == 2;
    const Gpu want = run_gpu(p, base);
    for (const Case& c : cases) {
      SCOPED_TRACE(c.name);
      RunOptions now = base;
      now.cfg.pre = c.pre, now.cfg.b2 = c.b2;
      expect_bitwise_equal(run_gpu(p, now), want);
      if (kept == 0) {
        const auto now_kept = forward_kept_bytes(p, now.cfg);
        EXPECT_TRUE(now_kept.first == old_kept.first) << "T";
        EXPECT_TRUE(now_kept.second == old_kept.second) << "G, W, V_new, entering states";
      }
    }
  }
}

// The row sweeps against the float64 recurrence with the layer's decays, decays near 1 and
// near 0, batch 2 x 1 and x 3 heads: held to the band and to within 2x the tile sweeps'
// whole-tensor error.
TEST_F(GdnCoreCuda, RowSweepsMatchFloat64RecurrenceAsTheTileSweepsDo) {
  SKIP_WITHOUT_GPU();
  for (const std::string decay : {"layer", "near 1", "near 0"})
    for (int64_t heads : {1, 3}) {
      Problem p = make_problem(rng, 2, 331, heads);  // 5 sub-chunks + 11 tokens
      for (double& g : p.g) {
        if (decay == "near 1") g = double(float(-1e-3 * rng.uniform(0, 1)));
        if (decay == "near 0") g = double(float(-20 * rng.uniform(0.5, 1)));
      }
      const Ref ref = reference(p);
      const auto e_tiles = errors(run_gpu(p, unsplit(GdnCudaConfig::kTileSweeps)), ref, rms_rel_err<double, double>);
      for (int key_split : {1, 2, 4}) {
        SCOPED_TRACE("decay " + decay + ", heads " + std::to_string(heads) + ", key split " + std::to_string(key_split));
        expect_band_and_twice(run_gpu(p, unsplit(GdnCudaConfig::kRowSweeps, key_split)), ref, e_tiles, decay == "near 0");
      }
    }
}

TEST_F(GdnCoreCuda, RejectsUnsupportedSizes) {
  GdnDims d;
  d.len = 64, d.dk = 64, d.dv = 128;
  EXPECT_THROW(gdn_cuda_workspace_bytes(d), Error);
  d.dk = 128, d.block = 32;
  EXPECT_THROW(gdn_cuda_workspace_bytes(d), Error);
  d.block = 64;
  GdnCudaConfig cfg;
  cfg.piece_len = 100;  // not a multiple of 64
  EXPECT_THROW(gdn_cuda_workspace_bytes(d, cfg), Error);
  for (auto [sweep, warps, key_split] : {std::tuple{3, 0, 0}, {int(GdnCudaConfig::kRowSweeps), 3, 0},
                                         {int(GdnCudaConfig::kRowSweeps), 16, 0}, {int(GdnCudaConfig::kRowSweeps), 0, 3},
                                         {int(GdnCudaConfig::kRowSweeps), 2, 4}}) {
    GdnCudaConfig bad;
    bad.sweep = sweep, bad.sweep_warps = warps, bad.sweep_key_split = key_split;
    EXPECT_THROW(gdn_chunk_forward_cuda(d, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                        &bad, nullptr, bad),
                 Error)
        << "sweep " << sweep << ", warps " << warps << ", key split " << key_split;
  }
  GdnCudaConfig bad_copy;
  bad_copy.sweep_copy_warp = 2;  // 1, -1 or 0
  EXPECT_THROW(gdn_chunk_forward_cuda(d, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                      &bad_copy, nullptr, bad_copy),
               Error);
  for (auto [multicast, copy_warp] : {std::pair{3, 0}, {8, -1}}) {  // 4 or 8 blocks, and only with the copy warp
    GdnCudaConfig bad_multicast;
    bad_multicast.sweep_multicast = multicast, bad_multicast.sweep_copy_warp = copy_warp;
    try {
      gdn_chunk_forward_cuda(d, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                             &bad_multicast, nullptr, bad_multicast);
      ADD_FAILURE() << "sweep_multicast " << multicast << " with sweep_copy_warp " << copy_warp << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("sweep_multicast"), std::string::npos) << e.what();
    }
  }
  for (auto [overlap, segment, streams, sweep] : {std::tuple{2, 0, 0, 0}, {1, -1, 0, 0}, {1, 0, 5, 0},
                                                  {1, 0, 0, int(GdnCudaConfig::kTileSweeps)}}) {
    GdnCudaConfig bad_overlap;  // 1, -1 or 0; segments of >= 1 sub-chunk; 1-4 streams; only the quarter sweeps count
    bad_overlap.overlap = overlap, bad_overlap.overlap_segment = segment, bad_overlap.overlap_streams = streams;
    bad_overlap.sweep = sweep;
    try {
      gdn_chunk_forward_cuda(d, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, &bad_overlap,
                             nullptr, bad_overlap);
      ADD_FAILURE() << "overlap " << overlap << ", segment " << segment << ", streams " << streams << ", sweep " << sweep
                    << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("overlap"), std::string::npos) << e.what();
    }
  }
  for (auto [pre, b2, copies, word] :
       {std::tuple{4, 0, 0, "pre must be"}, {0, 3, 0, "b2 must be"},
        {int(GdnCudaConfig::kPreLateV), 0, int(GdnCudaConfig::kCopyLoops), "kPreMma"},
        {0, int(GdnCudaConfig::kB2Lean), int(GdnCudaConfig::kCopyLoops), "kB2Plain"}}) {
    GdnCudaConfig bad;  // kDefault* or a named kernel (pre 0-3, b2 0-2); the new ones copy by plans
    bad.pre = pre, bad.b2 = b2, bad.tile_copies = copies;
    try {
      gdn_chunk_forward_cuda(d, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, &bad, nullptr,
                             bad);
      ADD_FAILURE() << "pre " << pre << ", b2 " << b2 << ", tile_copies " << copies << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
    }
  }
  GdnCudaConfig bad_slab;
  bad_slab.b4_slab = 8;  // B4 streams 16, 32 or 64 value rows at a time
  try {
    gdn_chunk_backward_cuda(d, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                            nullptr, nullptr, nullptr, nullptr, nullptr, &bad_slab, nullptr, bad_slab);
    ADD_FAILURE() << "b4_slab 8 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("b4_slab"), std::string::npos) << e.what();
  }
  GdnCudaConfig bad_ring;
  bad_ring.b4_kernel = GdnCudaConfig::kB4DeepRing;
  bad_ring.b4_slab = 64;  // the deep ring's steps are 16 or 32 rows
  try {
    gdn_chunk_backward_cuda(d, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                            nullptr, nullptr, nullptr, nullptr, nullptr, &bad_ring, nullptr, bad_ring);
    ADD_FAILURE() << "the deep-ring B4 with 64-row steps was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kB4TwoSlots"), std::string::npos) << e.what();
  }
}

// Sets an environment variable for one scope, restoring what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    setenv(name, value, 1);
  }
  ~ScopedEnv() { had_ ? setenv(name_, old_.c_str(), 1) : unsetenv(name_); }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

TEST_F(GdnCoreCuda, DefaultPieceLengthSweepB4AndOverlapSegmentComeFromTheEnvironment) {
  const char* var = "STATEFLOW_GDN_PIECE_LEN";
  GdnDims d;
  d.len = 4096, d.heads = 2;
  {
    ScopedEnv env(var, "off");
    EXPECT_EQ(gdn_cuda_default_piece_len(), GdnCudaConfig::kUnsplit);
    EXPECT_EQ(gdn_cuda_piece_len(d), 0);
  }
  {
    ScopedEnv env(var, "1024");
    EXPECT_EQ(gdn_cuda_default_piece_len(), 1024);
    EXPECT_EQ(gdn_cuda_piece_len(d), 1024);
    GdnCudaConfig unsplit_cfg;
    unsplit_cfg.piece_len = GdnCudaConfig::kUnsplit;  // the config's own choice wins
    EXPECT_EQ(gdn_cuda_piece_len(d, unsplit_cfg), 0);
  }
  {
    ScopedEnv env("STATEFLOW_GDN_SWEEP", "tiles");
    EXPECT_EQ(gdn_cuda_default_sweep(), GdnCudaConfig::kTileSweeps);
  }
  for (const char* bad : {"tile", "ROWS", ""}) {
    ScopedEnv env("STATEFLOW_GDN_SWEEP", bad);
    EXPECT_THROW(gdn_cuda_default_sweep(), Error) << "accepted '" << bad << "'";
  }
  {
    ScopedEnv env("STATEFLOW_GDN_B4", "wgmma");
    EXPECT_EQ(gdn_cuda_default_b4_mma(), GdnCudaConfig::kWgmma);
  }
  {
    ScopedEnv env("STATEFLOW_GDN_B4", "mma_sync");
    EXPECT_EQ(gdn_cuda_default_b4_mma(), GdnCudaConfig::kMmaSync);
  }
  for (const char* bad : {"WGMMA", "mma", ""}) {
    ScopedEnv env("STATEFLOW_GDN_B4", bad);
    EXPECT_THROW(gdn_cuda_default_b4_mma(), Error) << "accepted '" << bad << "'";
  }
  EXPECT_EQ(gdn_cuda_default_overlap_segment(), GdnCudaConfig::kDefaultOverlapSegment);
  {
    ScopedEnv env("STATEFLOW_GDN_OVERLAP_SEGMENT", "8");
    EXPECT_EQ(gdn_cuda_default_overlap_segment(), 8);
  }
  for (const char* bad : {"0", "-4", "8x", ""}) {
    ScopedEnv env("STATEFLOW_GDN_OVERLAP_SEGMENT", bad);
    EXPECT_THROW(gdn_cuda_default_overlap_segment(), Error) << "accepted '" << bad << "'";
  }
  // Pieces that do not divide 2048 would break the model's bitwise rule: refused, by name.
  for (const char* bad : {"4096", "100", "0", "-64", "512x", ""}) {
    ScopedEnv env(var, bad);
    try {
      gdn_cuda_default_piece_len();
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(var), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace stateflow

