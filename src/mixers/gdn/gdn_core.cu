// Gated DeltaNet chunk core on the GPU: forward (Pre / ST / Out) and backward (B1-B4) of
// MATH.md sections 3-4, one kernel per stage. See gdn_core_cuda.h for the contract.
//
// Per (batch, head) and sub-chunk n of C = 64 tokens (rows r, c in [0, C)):
//   G = local cumsum(g), gamma = exp(G), Gam[r,c] = exp(G_r - G_c) (c <= r), e_c = exp(G_L - G_c)
//   Pre:  A = strict_lower(beta_r (K K^T) Gam), T = (I + A)^-1,
//         W = T diag(beta gamma) K, U = T diag(beta) V
//   ST:   V_new = U - W S^T,  S <- gamma_L S + V_new^T diag(e) K
//   Out:  O = s (diag(gamma) Q S^T + (Q K^T ⊙ Gam) V_new)
// The padded tail of a short last sub-chunk is loaded as zeros with g = 0, which makes it an
// exact no-op (beta = 0, k = 0, G constant), so no kernel special-cases it except on stores.
//
// Workspace (per batch x head; Tp = NS * C rows, NS = ceil(len / C) sub-chunks):
//   G   fp32 [Tp]           local cumsums                      (Pre; or GdnCudaConfig::sweep_buffer)
//   W   bf16 [Tp][dk]       U bf16 [Tp][dv]                    (Pre; W or sweep_buffer)
//   Tm  bf16 [NS][C][C]     T = (I + A)^-1                     (Pre; or GdnCudaConfig::T_buffer)
//   Vn  bf16 [Tp][dv]       V_new                              (ST; or sweep_buffer)
//   Hs  bf16 [NS][dv][dk]   state entering each sub-chunk      (ST; or sweep_buffer)
//   dVn bf16 [Tp][dv]       dV_new_local, then dV_new in place (B2, B3)
//   dHs bf16 [NS][dv][dk]   gradient of the state leaving each sub-chunk (B3)
//   progress u32 [2][NS]    the overlap's segment counters (GdnCudaConfig::overlap)
#include "mixers/gdn/gdn_core_cuda.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "core/error.h"
#include "kernels/cuda/cluster_copy.cuh"
#include "kernels/cuda/levers.h"
#include "kernels/cuda/mma_tile.cuh"
#include "kernels/cuda/wgmma_tile.cuh"
#include "mixers/gdn/gdn_core_overlap_cuda.h"

namespace stateflow {
namespace {

using cuda::bf;
using cuda::bf16;
using cuda::AFrags;
using cuda::Frag;
using cuda::Lay;
using cuda::mma_acc;
using cuda::put2;
using cuda::row_dot;
using cuda::Tile;
using cuda::tile_at;

constexpr int C = 64;             // sub-chunk size
constexpr int DK = 128, DV = 128;  // head sizes this build supports
constexpr int LDF = C + 8;        // row stride of fp32 C x C scratch: float2/float4 rows, no bank conflicts
constexpr int BV_BWD = 16;        // dv tile of the backward sweeps (shared memory bound)

struct Args {
  int B, T, H, NS;
  int SP, NP;  // split core: sub-chunks per piece, pieces per (batch, head); NP = 1 when not split
  float scale;
  const bf16 *q, *k, *v, *dO;
  const float *beta, *g, *S_in, *dS_out;
  bf16 *o, *dq, *dk, *dv;
  float *S_out, *dbeta, *dg, *dS_in;
  float* G;
  bf16 *W, *U, *Vn, *Hs, *Tm, *dVn, *dHs;
  // Split core, fp32 [B][H][NP][128][128] each: the pieces' transitions (Ap), their maps of a zero
  // state (Up: forward state, backward state gradient) and the states the fold hands them (Sp).
  float *Ap, *Up, *Sp;
  // Overlap (gdn_core_overlap.cuh): the sweeps' segment counters (forward nseg, then reverse; null:
  // count nothing) and sub-chunks per segment; the first sub-chunk of a B4 launch.
  unsigned* progress;
  int seg, nseg, n0;

  // Row index of token (b, t, h) in the [B, T, H, *] tensors.
  __device__ int64_t tok(int b, int t, int h) const { return (int64_t(b) * T + t) * H + h; }
  // Workspace row of the first token of sub-chunk n of (b, h).
  __device__ int64_t ws_row(int b, int h, int n) const { return (int64_t(b) * H + h) * NS * C + int64_t(n) * C; }
  // Index of sub-chunk n of (b, h) among all sub-chunks.
  __device__ int64_t ws_sub(int b, int h, int n) const { return (int64_t(b) * H + h) * NS + n; }
  // Offset of row r of piece p's 128 x 128 matrix of (b, h) in Ap, Up, Sp.
  __device__ int64_t piece_row(int b, int h, int p, int r) const {
    return (((int64_t(b) * H + h) * NP + p) * 128 + r) * 128;
  }
};

// Stores the rows m0 + r < n_rows of a warp's accumulator tile as bf16 (row stride ld).
template <int WM, int WN>
__device__ void store_rows(Frag<WM, WN>& f, bf16* g, int64_t ld, int m0, int n0, int n_rows) {
  f.each_pair([&](int r, int c, float& x0, float& x1) {
    if (m0 + r < n_rows) put2(g + (m0 + r) * ld + n0 + c, x0, x1);
  });
}

// A block's copies of one tile type (256 threads) from global to shared memory: with kPlans each
// thread's share through its TileCopy, offsets computed once (GdnCudaConfig::tile_copies), else
// the generic load_tile_async loop, whose index and address arithmetic was about a quarter of B4's
// instructions. The same bytes land in the same places either way. The kernels that copy tiles
// take kPlans as a template parameter, so without it they compile to the code they were before.
template <class T, bool kPlans>
struct BlockCopy {
  cuda::TileCopy<256, T> plan;
  int tid;
  __device__ explicit BlockCopy(int t) : plan(t), tid(t) {}
  // Rows [0, n_valid) of the tile from g (row r at g + r * gstride), zeros below.
  __device__ void operator()(T tile, const bf16* g, int64_t gstride, int n_valid = T::rows) const {
    if constexpr (kPlans)
      plan(tile, g, gstride, n_valid);
    else
      cuda::load_tile_async<256>(tile, g, gstride, n_valid, tid);
  }
};

__device__ float warp_sum(float s) {
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

// beta and the local cumsum G of one sub-chunk (zeros past n_valid), gam = exp(G).
// Ends with a __syncthreads; 256 threads.
__device__ void load_decays(const Args& a, int64_t r0, int n_valid, float* G, float* gam, float* beta, int tid) {
  if (tid < C) {
    const bool ok = tid < n_valid;
    G[tid] = ok ? a.g[r0 + int64_t(tid) * a.H] : 0.f;
    beta[tid] = ok ? a.beta[r0 + int64_t(tid) * a.H] : 0.f;
  }
  __syncthreads();
  if (tid == 0) {
    float s = 0.f;
#pragma unroll
    for (int r = 0; r < C; ++r) G[r] = s += G[r];
  }
  __syncthreads();
  if (tid < C) gam[tid] = expf(G[tid]);
  __syncthreads();
}

// Rows r0..r0+3 of out (stride ld_o) = sign * L[rows][k0:k1) R[k0:k1)[col]: one thread's
// 4 x 1 piece of a block product on fp32 shared memory (L rows read 4 at a time).
__device__ void rows4_times_col(const float* L, int ldl, const float* R, int ldr, int r0, int col, int k0, int k1,
                                float sign, float* out, int ld_o) {
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (int k = k0; k < k1; k += 4) {
    const float r[4] = {R[k * ldr + col], R[(k + 1) * ldr + col], R[(k + 2) * ldr + col], R[(k + 3) * ldr + col]};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float4 l = *reinterpret_cast<const float4*>(L + (r0 + i) * ldl + k);
      acc[i] += l.x * r[0] + l.y * r[1] + l.z * r[2] + l.w * r[3];
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) out[(r0 + i) * ld_o + col] = sign * acc[i];
}

// A <- (I + A)^-1 in place, for strictly lower A (C x C fp32, stride LDF, zero above the
// diagonal); 256 threads, tmp holds 16 x C floats. Diagonal 16 x 16 blocks by forward
// substitution (one thread per column, in registers), then block rows in order:
// T_ij = -T_ii * sum_{j <= k < i} A_ik T_kj (row i of A is still intact when it is needed).
__device__ void invert_unit_lower(float* A, float* tmp, int tid) {
  float x[16];
  const int o = (tid >> 4) * 16, j = tid & 15;
  if (tid < C) {
#pragma unroll
    for (int r = 0; r < 16; ++r) x[r] = r == j ? 1.f : 0.f;
#pragma unroll
    for (int r = 1; r < 16; ++r) {
      float s = 0.f;  // row r of the block is zero from column r on, so whole float4s are safe
#pragma unroll
      for (int c = 0; c < r; c += 4) {
        const float4 a = *reinterpret_cast<const float4*>(A + (o + r) * LDF + o + c);
        s += a.x * x[c] + a.y * x[c + 1] + a.z * x[c + 2] + a.w * x[c + 3];
      }
      if (r > j) x[r] = -s;
    }
  }
  __syncthreads();  // every diagonal block is read before any is overwritten
  if (tid < C) {
#pragma unroll
    for (int r = 0; r < 16; ++r) A[(o + r) * LDF + o + j] = x[r];
  }
  __syncthreads();
  // Thread layout for the 16 x 16 block products: group jb = tid / 64 owns column block jb,
  // rows 4 * ((tid / 16) % 4) .. + 3, column tid % 16.
  const int jb = tid >> 6, r4 = ((tid >> 4) & 3) * 4, cc = tid & 15;
  for (int bi = 1; bi < 4; ++bi) {
    const int ob = bi * 16;
    if (jb < bi)  // tmp[:, jb block] = A[bi row block, jb .. bi) T[jb .. bi, jb block]
      rows4_times_col(A + ob * LDF, LDF, A, LDF, r4, jb * 16 + cc, jb * 16, ob, 1.f, tmp, C);
    __syncthreads();
    if (jb < bi)  // T[bi, jb] = -T[bi, bi] tmp[:, jb block]
      rows4_times_col(A + ob * LDF + ob, LDF, tmp, C, r4, jb * 16 + cc, 0, 16, -1.f, A + ob * LDF, LDF);
    __syncthreads();
  }
}

// ---------------------------------------------------------------------------------------
// Pre (forward; backward B1 when nothing was kept): one block per (sub-chunk, head, batch),
// 8 warps. Writes G, T, W, U to the workspace (T to a.Tm: the workspace's or a kept buffer).
// kFromT (backward B1 with a kept T): reads T from a.Tm instead of forming and inverting A.
// T is rounded to bf16 before W and U are formed from it, in both, so they match bitwise.
// ---------------------------------------------------------------------------------------
template <bool kFromT>
struct PreSmem {
  static constexpr int k = 0;
  static constexpr int v = k + Tile<C, DK>::bytes;
  static constexpr int A = v + Tile<C, DV>::bytes;  // A, then T in place (not kFromT)
  static constexpr int tmp = A + (kFromT ? 0 : C * LDF * 4);
  static constexpr int Tw = tmp + (kFromT ? 0 : 16 * C * 4);
  static constexpr int Tu = Tw + Tile<C, C>::bytes;
  static constexpr int vec = Tu + Tile<C, C>::bytes;
  static constexpr int bytes = vec + 3 * C * 4;
};

__device__ inline float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// Pre's inputs (pre_kernel and pre_mma_kernel): the k and v rows (one plan: DV = DK) and the copies
// more() issues with them, loaded under the decays (load_decays; G also to the workspace).
// kV: V too (pre_mma_kernel's late V loads it later).
template <bool kPlans, bool kV = true, class More>
__device__ void load_pre_inputs(const Args& a, Tile<C, DK> Ks, Tile<C, DV> Vs, int64_t r0, int64_t ws0, int nv,
                                float* G, float* gam, float* beta, int tid, More&& more) {
  const BlockCopy<Tile<C, DK>, kPlans> copy_rows(tid);
  copy_rows(Ks, a.k + r0 * DK, int64_t(a.H) * DK, nv);
  if constexpr (kV) copy_rows(Vs, a.v + r0 * DV, int64_t(a.H) * DV, nv);
  more();
  cuda::cp_async_commit();
  load_decays(a, r0, nv, G, gam, beta, tid);
  if (tid < C) a.G[ws0 + tid] = G[tid];
  cuda::cp_async_wait_all();
  __syncthreads();
}

template <bool kFromT, bool kPlans>
__global__ void __launch_bounds__(256) pre_kernel(Args a) {
  using S = PreSmem<kFromT>;
  extern __shared__ __align__(128) char sm[];
  const int n = blockIdx.x, h = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  const int wm = (tid >> 5) & 3, wn = tid >> 7;  // 4 x 2 warp grid
  const int t0 = n * C, nv = min(C, a.T - t0);
  const int64_t r0 = a.tok(b, t0, h), ws0 = a.ws_row(b, h, n);
  bf16* Tg = a.Tm + a.ws_sub(b, h, n) * C * C;
  auto Ks = tile_at<Tile<C, DK>>(sm, S::k);
  auto Vs = tile_at<Tile<C, DV>>(sm, S::v);
  auto Tw = tile_at<Tile<C, C>>(sm, S::Tw), Tu = tile_at<Tile<C, C>>(sm, S::Tu);
  float* Af = reinterpret_cast<float*>(sm + S::A);
  float *G = reinterpret_cast<float*>(sm + S::vec), *gam = G + C, *beta = gam + C;

  load_pre_inputs<kPlans>(a, Ks, Vs, r0, ws0, nv, G, gam, beta, tid, [] {});
  if constexpr (!kFromT) {
    {
      Frag<16, 32> kk;
      kk.fill(0.f);
      mma_acc<DK, Lay::Row, Lay::Col>(kk, Ks, wm * 16, Ks, wn * 32);
      kk.each_pair([&](int r, int c, float& x0, float& x1) {
        r += wm * 16, c += wn * 32;
        *reinterpret_cast<float2*>(Af + r * LDF + c) =
            make_float2(c < r ? beta[r] * x0 * expf(G[r] - G[c]) : 0.f,
                        c + 1 < r ? beta[r] * x1 * expf(G[r] - G[c + 1]) : 0.f);
      });
    }
    __syncthreads();
    invert_unit_lower(Af, reinterpret_cast<float*>(sm + S::tmp), tid);
  }
  for (int i = tid; i < C * C / 2; i += 256) {
    const int r = i / (C / 2), c = 2 * (i % (C / 2));
    float x0, x1;
    if constexpr (kFromT) {
      const __nv_bfloat162 t = *reinterpret_cast<const __nv_bfloat162*>(Tg + r * C + c);
      x0 = __low2float(t), x1 = __high2float(t);
    } else {
      x0 = round_bf16(Af[r * LDF + c]), x1 = round_bf16(Af[r * LDF + c + 1]);
      put2(Tg + r * C + c, x0, x1);
    }
    put2(Tw.at(r, c), x0 * beta[c] * gam[c], x1 * beta[c + 1] * gam[c + 1]);
    put2(Tu.at(r, c), x0 * beta[c], x1 * beta[c + 1]);
  }
  __syncthreads();
  {
    Frag<16, DK / 2> w;
    w.fill(0.f);
    mma_acc<C, Lay::Row, Lay::Row>(w, Tw, wm * 16, Ks, wn * DK / 2);
    store_rows(w, a.W + ws0 * DK, DK, wm * 16, wn * DK / 2, C);
  }
  {
    Frag<16, DV / 2> u;
    u.fill(0.f);
    mma_acc<C, Lay::Row, Lay::Row>(u, Tu, wm * 16, Vs, wn * DV / 2);
    store_rows(u, a.U + ws0 * DV, DV, wm * 16, wn * DV / 2, C);
  }
}

#include "mixers/gdn/gdn_core_pre.cuh"

// ---------------------------------------------------------------------------------------
// B2: dV_new_local = P^T dO with P = s (Q K^T) ⊙ Gam (MATH.md 4.3); one block per
// (sub-chunk, head, batch), 8 warps. Reads G from the workspace.
// ---------------------------------------------------------------------------------------
struct DvlocSmem {
  static constexpr int q = 0;
  static constexpr int k = q + Tile<C, DK>::bytes;
  static constexpr int dO = k + Tile<C, DK>::bytes;
  static constexpr int P = dO + Tile<C, DV>::bytes;
  static constexpr int G = P + Tile<C, C>::bytes;
  static constexpr int bytes = G + C * 4;
};

// P = s (Q K^T) ⊙ Gam below and on the diagonal, zero above, rounded to bf16 into Ps, from a warp's
// 16 x 32 block of Q K^T (rows 16 wm.., columns 32 wn..): both B2 kernels.
__device__ void store_P(Frag<16, 32>& qk, Tile<C, C> Ps, const float* G, float scale, int wm, int wn) {
  qk.each([&](int r, int c, float& x) {
    r += wm * 16, c += wn * 32;
    *Ps.at(r, c) = __float2bfloat16(c <= r ? scale * x * expf(G[r] - G[c]) : 0.f);
  });
}

template <bool kPlans>
__global__ void __launch_bounds__(256) dvloc_kernel(Args a) {
  using S = DvlocSmem;
  extern __shared__ __align__(128) char sm[];
  const int n = blockIdx.x, h = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  const int wm = (tid >> 5) & 3, wn = tid >> 7;
  const int t0 = n * C, nv = min(C, a.T - t0);
  const int64_t r0 = a.tok(b, t0, h), ws0 = a.ws_row(b, h, n);
  auto Qs = tile_at<Tile<C, DK>>(sm, S::q), Ks = tile_at<Tile<C, DK>>(sm, S::k);
  auto dOs = tile_at<Tile<C, DV>>(sm, S::dO);
  auto Ps = tile_at<Tile<C, C>>(sm, S::P);
  float* G = reinterpret_cast<float*>(sm + S::G);
  const BlockCopy<Tile<C, DK>, kPlans> copy_rows(tid);  // DV = DK: one plan for q, k and dO
  copy_rows(Qs, a.q + r0 * DK, int64_t(a.H) * DK, nv);
  copy_rows(Ks, a.k + r0 * DK, int64_t(a.H) * DK, nv);
  copy_rows(dOs, a.dO + r0 * DV, int64_t(a.H) * DV, nv);
  cuda::load_floats_async<256>(G, a.G + ws0, C, tid);
  cuda::cp_async_commit();
  cuda::cp_async_wait_all();
  __syncthreads();
  {
    Frag<16, 32> qk;
    qk.fill(0.f);
    mma_acc<DK, Lay::Row, Lay::Col>(qk, Qs, wm * 16, Ks, wn * 32);
    store_P(qk, Ps, G, a.scale, wm, wn);
  }
  __syncthreads();
  Frag<16, DV / 2> d;
  d.fill(0.f);
  mma_acc<C, Lay::Col, Lay::Row>(d, Ps, wm * 16, dOs, wn * DV / 2);
  store_rows(d, a.dVn + ws0 * DV, DV, wm * 16, wn * DV / 2, C);
}

#include "mixers/gdn/gdn_core_b2.cuh"

// ---------------------------------------------------------------------------------------
// ST sweeps: a group of NW warps owns rows [vt*BV, vt*BV + BV) of the state of one
// (batch, head) and walks the sub-chunks in order; the state lives in mma accumulators
// (fp32); the operands of the next STAGES - 1 sub-chunks are in flight (cp.async) while one
// is computed.
// ---------------------------------------------------------------------------------------
template <int BV, int STAGES>
struct FwdSweepSmem {
  static constexpr int W = 0;  // STAGES buffers of each streamed operand
  static constexpr int K = W + STAGES * Tile<C, DK>::bytes;
  static constexpr int U = K + STAGES * Tile<C, DK>::bytes;
  static constexpr int G = U + STAGES * Tile<C, BV>::bytes;
  static constexpr int S = G + STAGES * C * 4;
  static constexpr int Vne = S + Tile<BV, DK>::bytes;
  static constexpr int bytes = Vne + Tile<C, BV>::bytes;
};

// What one forward sweep block walks: sub-chunks [n0, n1) of (b, h), rows [row0, row0 + BV)
// of a 128 x 128 state. The unsplit core walks every sub-chunk from S_in; the split core walks
// one piece three ways (zero state, identity, the folded state; see "Split core" below).
struct FwdSpan {
  int n0, n1, row0;
  const float* from;  // the tile's starting rows (row stride 128); nullptr: zero, or I when transition
  float* to;          // where the tile's final rows go, or nullptr
  bool transition;    // start from rows row0.. of I with U taken as zero: the rows of the span's transition
  bool write_ws;      // write V_new and the sub-chunk snapshots Hs (only a sweep from the true state)
};

// Forward sweep (MATH.md ST) over one span. gt: thread index within the group; bar: its named barrier.
template <int BV, int STAGES, int NW>
__device__ void forward_sweep(const Args& a, int b, int h, const FwdSpan& sp, char* sm, int gt, int bar) {
  using S = FwdSweepSmem<BV, STAGES>;
  constexpr int NT = NW * 32, WN = DK / NW;  // threads; state columns per warp
  constexpr int VN = BV * 4 / NW;            // columns of the C x BV products per warp
  const int warp = gt >> 5, m0 = (warp & 3) * 16, n0 = (warp >> 2) * VN, vt0 = sp.row0;
  auto Wt = [&](int s) { return tile_at<Tile<C, DK>>(sm, S::W + s * Tile<C, DK>::bytes); };
  auto Kt = [&](int s) { return tile_at<Tile<C, DK>>(sm, S::K + s * Tile<C, DK>::bytes); };
  auto Ut = [&](int s) { return tile_at<Tile<C, BV>>(sm, S::U + s * Tile<C, BV>::bytes); };
  auto Gt = [&](int s) { return reinterpret_cast<float*>(sm + S::G + s * C * 4); };
  auto Ss = tile_at<Tile<BV, DK>>(sm, S::S);
  auto Vne = tile_at<Tile<C, BV>>(sm, S::Vne);

  Frag<BV, WN> st;  // rows v of the tile, columns warp * WN + c
  if (sp.from) {
    const float* src = sp.from + warp * WN;
    st.each([&](int r, int c, float& x) { x = src[r * DK + c]; });
  } else if (sp.transition) {
    st.each([&](int r, int c, float& x) { x = vt0 + r == warp * WN + c ? 1.f : 0.f; });
  } else {
    st.fill(0.f);
  }
  const int steps = sp.n1 - sp.n0;
  auto issue = [&](int n, int s) {
    const int t0 = n * C;
    const int64_t ws0 = a.ws_row(b, h, n);
    cuda::load_tile_async<NT>(Wt(s), a.W + ws0 * DK, DK, C, gt);
    cuda::load_tile_async<NT>(Kt(s), a.k + a.tok(b, t0, h) * DK, int64_t(a.H) * DK, min(C, a.T - t0), gt);
    if (!sp.transition) cuda::load_tile_async<NT>(Ut(s), a.U + ws0 * DV + vt0, DV, C, gt);
    cuda::load_floats_async<NT>(Gt(s), a.G + ws0, C, gt);
  };
  for (int i = 0; i < STAGES - 1; ++i) {  // one commit group per sub-chunk, empty past the end
    if (i < steps) issue(sp.n0 + i, i);
    cuda::cp_async_commit();
  }
  for (int i = 0; i < steps; ++i) {
    const int n = sp.n0 + i, s = i % STAGES;
    cuda::cp_async_wait<STAGES - 2>();
    cuda::group_sync(bar, NT);
    if (i + STAGES - 1 < steps) issue(n + STAGES - 1, (i + STAGES - 1) % STAGES);
    cuda::cp_async_commit();
    // The entering state rounded to bf16: operand of W S^T and the snapshot Out / B4 read.
    st.each_pair([&](int r, int c, float& x0, float& x1) { put2(Ss.at(r, warp * WN + c), x0, x1); });
    cuda::group_sync(bar, NT);
    const int64_t ws0 = a.ws_row(b, h, n);
    const float* G = Gt(s);
    const float GL = G[C - 1];
    {
      Frag<16, VN> vn;  // V_new rows m0.., columns n0..
      vn.fill(0.f);
      mma_acc<DK, Lay::Row, Lay::Col>(vn, Wt(s), m0, Ss, n0);
      vn.each_pair([&](int r, int c, float& x0, float& x1) {
        r += m0, c += n0;
        const bf16* u = Ut(s).at(r, c);
        const float u0 = sp.transition ? 0.f : bf(u[0]), u1 = sp.transition ? 0.f : bf(u[1]);
        const float v0 = u0 - x0, v1 = u1 - x1, e = expf(GL - G[r]);
        if (sp.write_ws) put2(a.Vn + (ws0 + r) * DV + vt0 + c, v0, v1);
        put2(Vne.at(r, c), v0 * e, v1 * e);
      });
    }
    if (sp.write_ws) {
      bf16* hs = a.Hs + (a.ws_sub(b, h, n) * DV + vt0) * DK;
      for (int j = gt; j < BV * DK / 8; j += NT) {
        const int r = j / (DK / 8), c = (j % (DK / 8)) * 8;
        *reinterpret_cast<uint4*>(hs + r * DK + c) = *reinterpret_cast<const uint4*>(Ss.at(r, c));
      }
    }
    cuda::group_sync(bar, NT);
    const float gl = expf(GL);
    st.each([&](int, int, float& x) { x *= gl; });
    mma_acc<C, Lay::Col, Lay::Row>(st, Vne, 0, Kt(s), warp * WN);
  }
  if (sp.to) {
    float* dst = sp.to + warp * WN;
    st.each([&](int r, int c, float& x) { dst[r * DK + c] = x; });
  }
}

template <int BV, int STAGES>
struct BwdSweepSmem {
  static constexpr int K = 0;  // STAGES buffers of each streamed operand
  static constexpr int W = K + STAGES * Tile<C, DK>::bytes;
  static constexpr int Q = W + STAGES * Tile<C, DK>::bytes;
  static constexpr int dO = Q + STAGES * Tile<C, DK>::bytes;
  static constexpr int dVl = dO + STAGES * Tile<C, BV>::bytes;
  static constexpr int G = dVl + STAGES * Tile<C, BV>::bytes;
  static constexpr int dS = G + STAGES * C * 4;
  static constexpr int dVneg = dS + Tile<BV, DK>::bytes;
  static constexpr int dOg = dVneg + Tile<C, BV>::bytes;
  static constexpr int bytes = dOg + Tile<C, BV>::bytes;
};

// Reverse sweep B3 (MATH.md 4.4): per sub-chunk, last to first,
//   dSe = dS;  dV_new = dV_new_local + diag(e) K dS^T;
//   dS = gamma_L dS + s (diag(gamma) dO)^T Q - dV_new^T W.
// Over sub-chunks [n0, n1) of (b, h), last first, rows [row0, row0 + BV) of the gradient:
// starts from `from` (the gradient leaving the span; nullptr: zero), ends in `to` (the gradient
// entering it) when non-null; with write_ws writes dV_new over dV_new_local and the bf16
// snapshots dHs of dSe (only a sweep from the true gradient).
struct BwdSpan {
  int n0, n1, row0;
  const float* from;
  float* to;
  bool write_ws;
};

template <int BV, int STAGES, int NW>
__device__ void backward_sweep(const Args& a, int b, int h, const BwdSpan& sp, char* sm, int gt, int bar) {
  using S = BwdSweepSmem<BV, STAGES>;
  constexpr int NT = NW * 32, WN = DK / NW;
  constexpr int VN = BV * 4 / NW;
  const int warp = gt >> 5, m0 = (warp & 3) * 16, n0 = (warp >> 2) * VN, vt0 = sp.row0;
  auto Kt = [&](int s) { return tile_at<Tile<C, DK>>(sm, S::K + s * Tile<C, DK>::bytes); };
  auto Wt = [&](int s) { return tile_at<Tile<C, DK>>(sm, S::W + s * Tile<C, DK>::bytes); };
  auto Qt = [&](int s) { return tile_at<Tile<C, DK>>(sm, S::Q + s * Tile<C, DK>::bytes); };
  auto dOt = [&](int s) { return tile_at<Tile<C, BV>>(sm, S::dO + s * Tile<C, BV>::bytes); };
  auto dVlt = [&](int s) { return tile_at<Tile<C, BV>>(sm, S::dVl + s * Tile<C, BV>::bytes); };
  auto Gt = [&](int s) { return reinterpret_cast<float*>(sm + S::G + s * C * 4); };
  auto dSs = tile_at<Tile<BV, DK>>(sm, S::dS);
  auto dVneg = tile_at<Tile<C, BV>>(sm, S::dVneg);
  auto dOg = tile_at<Tile<C, BV>>(sm, S::dOg);

  Frag<BV, WN> ds;
  if (sp.from) {
    const float* src = sp.from + warp * WN;
    ds.each([&](int r, int c, float& x) { x = src[r * DK + c]; });
  } else {
    ds.fill(0.f);
  }
  auto issue = [&](int n, int s) {
    const int t0 = n * C, nv = min(C, a.T - t0);
    const int64_t ws0 = a.ws_row(b, h, n), r0 = a.tok(b, t0, h);
    cuda::load_tile_async<NT>(Kt(s), a.k + r0 * DK, int64_t(a.H) * DK, nv, gt);
    cuda::load_tile_async<NT>(Wt(s), a.W + ws0 * DK, DK, C, gt);
    cuda::load_tile_async<NT>(Qt(s), a.q + r0 * DK, int64_t(a.H) * DK, nv, gt);
    cuda::load_tile_async<NT>(dOt(s), a.dO + r0 * DV + vt0, int64_t(a.H) * DV, nv, gt);
    cuda::load_tile_async<NT>(dVlt(s), a.dVn + ws0 * DV + vt0, DV, C, gt);
    cuda::load_floats_async<NT>(Gt(s), a.G + ws0, C, gt);
  };
  const int steps = sp.n1 - sp.n0;
  for (int i = 0; i < STAGES - 1; ++i) {  // step i works on sub-chunk n1 - 1 - i
    if (i < steps) issue(sp.n1 - 1 - i, i);
    cuda::cp_async_commit();
  }
  for (int i = 0; i < steps; ++i) {
    const int n = sp.n1 - 1 - i, s = i % STAGES;
    cuda::cp_async_wait<STAGES - 2>();
    cuda::group_sync(bar, NT);
    if (i + STAGES - 1 < steps) issue(n - (STAGES - 1), (i + STAGES - 1) % STAGES);
    cuda::cp_async_commit();
    const float* G = Gt(s);
    const float GL = G[C - 1];
    ds.each_pair([&](int r, int c, float& x0, float& x1) { put2(dSs.at(r, warp * WN + c), x0, x1); });
    for (int j = gt; j < C * BV / 2; j += NT) {
      const int r = j / (BV / 2), c = 2 * (j % (BV / 2));
      const float f = a.scale * expf(G[r]);
      const bf16* p = dOt(s).at(r, c);
      put2(dOg.at(r, c), f * bf(p[0]), f * bf(p[1]));
    }
    cuda::group_sync(bar, NT);
    // The part of the update that does not need this sub-chunk's dV_new.
    const float gl = expf(GL);
    ds.each([&](int, int, float& x) { x *= gl; });
    mma_acc<C, Lay::Col, Lay::Row>(ds, dOg, 0, Qt(s), warp * WN);
    const int64_t ws0 = a.ws_row(b, h, n);
    {
      Frag<16, VN> dvn;
      dvn.fill(0.f);
      mma_acc<DK, Lay::Row, Lay::Col>(dvn, Kt(s), m0, dSs, n0);
      dvn.each_pair([&](int r, int c, float& x0, float& x1) {
        r += m0, c += n0;
        const bf16* l = dVlt(s).at(r, c);
        const float e = expf(GL - G[r]), d0 = bf(l[0]) + e * x0, d1 = bf(l[1]) + e * x1;
        if (sp.write_ws) put2(a.dVn + (ws0 + r) * DV + vt0 + c, d0, d1);
        put2(dVneg.at(r, c), -d0, -d1);
      });
    }
    if (sp.write_ws) {
      bf16* dhs = a.dHs + (a.ws_sub(b, h, n) * DV + vt0) * DK;
      for (int j = gt; j < BV * DK / 8; j += NT) {
        const int r = j / (DK / 8), c = (j % (DK / 8)) * 8;
        *reinterpret_cast<uint4*>(dhs + r * DK + c) = *reinterpret_cast<const uint4*>(dSs.at(r, c));
      }
    }
    cuda::group_sync(bar, NT);
    mma_acc<C, Lay::Col, Lay::Row>(ds, dVneg, 0, Wt(s), warp * WN);
  }
  if (sp.to) {
    float* dst = sp.to + warp * WN;
    ds.each([&](int r, int c, float& x) { dst[r * DK + c] = x; });
  }
}

constexpr int SWEEP_STAGES = 3;  // pipeline depth of a sweep that has its SM to itself

constexpr int SWEEP_WARPS = 8;   // warps of a sweep that has its SM to itself

// The unsplit core's spans: every sub-chunk of (b, h), rows of dv tile vt, from S_in / dS_out.
__device__ FwdSpan whole_forward(const Args& a, int b, int h, int vt, int bv, bool store_state) {
  const int64_t tile = ((int64_t(b) * a.H + h) * DV + vt * bv) * DK;
  return {0, a.NS, vt * bv, a.S_in ? a.S_in + tile : nullptr, store_state && a.S_out ? a.S_out + tile : nullptr,
          false, true};
}
__device__ BwdSpan whole_backward(const Args& a, int b, int h, int vt, int bv) {
  const int64_t tile = ((int64_t(b) * a.H + h) * DV + vt * bv) * DK;
  return {0, a.NS, vt * bv, a.dS_out ? a.dS_out + tile : nullptr, a.dS_in + tile, true};
}

template <int BV>
__global__ void __launch_bounds__(SWEEP_WARPS * 32) st_forward_kernel(Args a) {
  extern __shared__ __align__(128) char sm[];
  const FwdSpan sp = whole_forward(a, blockIdx.z, blockIdx.y, blockIdx.x, BV, true);
  forward_sweep<BV, SWEEP_STAGES, SWEEP_WARPS>(a, blockIdx.z, blockIdx.y, sp, sm, threadIdx.x, 1);
}

// B3 alone, when the forward's sub-chunk states and V_new are still in the workspace.
__global__ void __launch_bounds__(SWEEP_WARPS * 32) st_reverse_kernel(Args a) {
  extern __shared__ __align__(128) char sm[];
  const BwdSpan sp = whole_backward(a, blockIdx.z, blockIdx.y, blockIdx.x, BV_BWD);
  backward_sweep<BV_BWD, SWEEP_STAGES, SWEEP_WARPS>(a, blockIdx.z, blockIdx.y, sp, sm, threadIdx.x, 1);
}

// B1' + B3 when nothing was kept: warpgroup 0 recomputes the forward sweep (Hs, Vn for B4),
// warpgroup 1 runs the reverse sweep; they are independent and share only the SM.
using FwdSweepBoth = FwdSweepSmem<BV_BWD, 2>;
using BwdSweepBoth = BwdSweepSmem<BV_BWD, 2>;
__global__ void __launch_bounds__(256) st_backward_kernel(Args a) {
  extern __shared__ __align__(128) char sm[];
  const int b = blockIdx.z, h = blockIdx.y, vt = blockIdx.x;
  if (threadIdx.x < 128)
    forward_sweep<BV_BWD, 2, 4>(a, b, h, whole_forward(a, b, h, vt, BV_BWD, false), sm, threadIdx.x, 1);
  else
    backward_sweep<BV_BWD, 2, 4>(a, b, h, whole_backward(a, b, h, vt, BV_BWD), sm + FwdSweepBoth::bytes,
                                 threadIdx.x - 128, 2);
}

// ---------------------------------------------------------------------------------------
// Row sweeps: a warp keeps 16 value rows of the state (fp32) in its registers for the whole
// sequence, either all 128 key columns (KS = 1) or one half of them (KS = 2, two warps per
// rows), and does the step's products itself with the operands one product hands the next in
// registers (accumulator -> A fragment): the state's bf16 rounding is the A operand of
// V_new^T = U^T - S W^T, and V_new^T (scaled by e) that of S <- gamma_L S + V_new^T K. With
// KS = 2 the two warps of a row group add their halves of S W^T through shared memory (a
// barrier of the pair; each adds them in the same order, so both hold the same V_new). The
// RG x KS warps of a block own 16 RG consecutive rows of one (batch, head) and share its W, K
// (and Q) tiles, loaded once per block (cp.async, STAGES - 1 sub-chunks ahead): one block
// barrier per step. Same products and roundings as the tile sweeps, in the transposed
// orientation; the KS = 2 halves add S W^T in another order.
// ---------------------------------------------------------------------------------------
constexpr int RW = 16;  // value rows per warp

template <int RG, int KS, int STAGES, bool REVERSE>
struct RowSmem {
  static constexpr int BV = RG * RW, NWB = RG * KS;
  static constexpr int tk = Tile<C, DK>::bytes, tv = Tile<C, BV>::bytes;
  // forward: W, K, U; reverse: K, W, Q, dO, dV_new_local (STAGES buffers of each)
  static constexpr int K = 0, W = K + STAGES * tk, Q = W + STAGES * tk;
  static constexpr int V = (REVERSE ? Q + STAGES * tk : Q);  // U, or dO then dV_new_local
  static constexpr int V2 = V + STAGES * tv;  // reverse only
  static constexpr int G = (REVERSE ? V2 : V) + STAGES * tv;
  static constexpr int out = G + STAGES * C * 4;  // per warp: what it writes, staged for 16-byte stores
  static constexpr int stage_bytes = KS == 4 ? 0 : Tile<RW, DK>::bytes;  // (quarter sweeps: in their xch slot)
  static constexpr int xch = out + NWB * stage_bytes;  // per warp: its part of S W^T (KS = 2, 4)
  static constexpr int op = xch + (KS > 1 ? NWB * RW * C * 4 : 0);  // per row group: the update's operand (KS = 4)
  static constexpr int bytes = op + (KS == 4 ? RG * Tile<RW, C>::bytes : 0);
};
static_assert(Tile<C, RW>::bytes <= Tile<RW, DK>::bytes, "a warp's staging area holds its state rows or its 64 x 16 values");

// Pipeline depth of the row sweeps: three sub-chunks in flight where shared memory allows.
constexpr int kMaxSmem = 227 * 1024;
template <int RG, int KS, bool REVERSE>
__host__ __device__ constexpr int row_stages() {
  return RowSmem<RG, KS, 3, REVERSE>::bytes <= kMaxSmem ? 3 : 2;
}

// A warp's bf16 16 x KW state rows (A fragments) to rows [0, 16), columns [0, KW) of a
// [DV][DK] matrix g, through its staging area (a 16 x LD tile: stmatrix, then 16-byte stores
// of whole rows).
template <int KW, int LD = DK>
__device__ void store_state_rows(const AFrags<KW>& s, char* stage, bf16* g) {
  constexpr int CR = KW / 8;  // 16-byte chunks per row
  const auto st = tile_at<Tile<RW, LD>>(stage, 0);
#pragma unroll
  for (int kb = 0; kb < KW / 16; ++kb) cuda::store_a<Lay::Row>(s[kb], st, 0, 16 * kb);
  __syncwarp();
  const int l = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < RW * CR / 32; ++i) {
    const int r = l / CR + (32 / CR) * i, c = (l % CR) * 8;
    *reinterpret_cast<uint4*>(g + r * DK + c) = *reinterpret_cast<const uint4*>(st.at(r, c));
  }
  __syncwarp();
}

// Token rows [j0, j0 + C / KS) of a warp's 16 x 64 fp32 accumulator f (f(i, j): value row i,
// token j) rounded to bf16, to the [token][DV] rows g[j * DV + i], i < 16, through its staging
// area (stmatrix.trans).
template <int KS>
__device__ void store_token_major(const Frag<RW, C>& f, int j0, char* stage, bf16* g) {
  const auto st = tile_at<Tile<C, RW>>(stage, 0);
  AFrags<C> a;
  cuda::acc_to_a(f, a);
#pragma unroll
  for (int kb = 0; kb < C / 16; ++kb)  // a constant index into a: a run-time one would move it to local memory
    if (16 * kb >= j0 && 16 * kb < j0 + C / KS) cuda::store_a<Lay::Col>(a[kb], st, 0, 16 * kb);
  __syncwarp();
  const int l = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < C / KS * 2 / 32; ++i) {
    const int r = j0 + (l >> 1) + 16 * i, c = (l & 1) * 8;
    *reinterpret_cast<uint4*>(g + r * DV + c) = *reinterpret_cast<const uint4*>(st.at(r, c));
  }
  __syncwarp();
}

// KS = 2: the pair's sum of a 16 x 64 accumulator, first half's term first in both warps.
template <int KS>
__device__ void add_pair(Frag<RW, C>& f, int kh, float4* mine, const float4* theirs, int bar) {
  if constexpr (KS > 1) {
    const int l = threadIdx.x & 31;
#pragma unroll
    for (int j = 0; j < C / 8; ++j) mine[j * 32 + l] = make_float4(f.x[0][j][0], f.x[0][j][1], f.x[0][j][2], f.x[0][j][3]);
    cuda::group_sync(bar, 64);
#pragma unroll
    for (int j = 0; j < C / 8; ++j) {
      const float4 o = theirs[j * 32 + l];
      const float ov[4] = {o.x, o.y, o.z, o.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) f.x[0][j][e] = kh == 0 ? f.x[0][j][e] + ov[e] : ov[e] + f.x[0][j][e];
    }
  }
}

// Per-token factors for the token columns j = 8 n + 2 (lane % 4) + p this lane holds in a
// 16 x 64 accumulator: e_j = exp(G_L - G_j), and (reverse sweep) s gamma_j = s exp(G_j).
__device__ void lane_decays(const float* G, float (&e)[C / 8][2]) {
  const int c = 2 * (threadIdx.x & 3);
  const float GL = G[C - 1];
#pragma unroll
  for (int n = 0; n < C / 8; ++n) e[n][0] = expf(GL - G[8 * n + c]), e[n][1] = expf(GL - G[8 * n + c + 1]);
}
__device__ void lane_gammas(const float* G, float s, float (&f)[C / 8][2]) {
  const int c = 2 * (threadIdx.x & 3);
#pragma unroll
  for (int n = 0; n < C / 8; ++n) f[n][0] = s * expf(G[8 * n + c]), f[n][1] = s * expf(G[8 * n + c + 1]);
}

// The reverse sweep's A operand (s gamma_j dO_j)^T, value rows v0.. x C tokens, from the dO tile;
// rounded to bf16 as the tile sweep rounds it.
template <class T>
__device__ void scaled_dO_operand(AFrags<C>& og, T dO, int v0, const float* G, float scale) {
  float f[C / 8][2];
  lane_gammas(G, scale, f);
#pragma unroll
  for (int kb = 0; kb < C / 16; ++kb) {
    cuda::load_a<Lay::Col>(og[kb], dO, v0, 16 * kb);
#pragma unroll
    for (int hh = 0; hh < 4; ++hh) {  // register hh holds token columns 16 kb + 8 (hh / 2) + 2 (lane % 4) + {0, 1}
      const float2 x = cuda::unpack2(og[kb][hh]);
      const float* fj = f[2 * kb + (hh >> 1)];
      og[kb][hh] = cuda::pack2(fj[0] * x.x, fj[1] * x.y);
    }
  }
}

// 64 fp32 values (a sub-chunk's G) by the block's first 16 threads; zeros when !live.
__device__ void copy_g_async(float* s, const float* g, int tid, bool live) {
  if (tid < C / 4) cuda::cp_async16(s + 4 * tid, live ? g + 4 * tid : g, live);
}

// The rows a row-sweep warp owns: value rows v0.. (16), key columns k0.. (DK / KS).
template <int RG, int KS>
struct RowWarp {
  int warp, kh, k0, v0;  // v0 relative to the block's first row
  __device__ RowWarp() : warp(threadIdx.x >> 5), kh(warp % KS), k0(kh * (DK / KS)), v0((warp / KS) * RW) {}
  __device__ int pair_bar() const { return 1 + warp / KS; }  // named barrier of the pair (ids 1..RG)
};

// Forward sweep over every sub-chunk of (b, h), rows [row0, row0 + 16 RG): from `from` (the
// block's rows of S_in, or zero when null), the final rows to `to` when non-null, V_new and
// the sub-chunk snapshots Hs to the workspace.
template <int RG, int KS, int STAGES>
__device__ void row_forward_sweep(const Args& a, int b, int h, int row0, const float* from, float* to, char* sm) {
  using S = RowSmem<RG, KS, STAGES, false>;
  constexpr int NT = S::NWB * 32, BV = S::BV, KW = DK / KS;
  const int tid = threadIdx.x;
  const RowWarp<RG, KS> w;
  auto Wt = [&](int s) { return tile_at<Tile<C, DK>>(sm, S::W + s * S::tk); };
  auto Kt = [&](int s) { return tile_at<Tile<C, DK>>(sm, S::K + s * S::tk); };
  auto Ut = [&](int s) { return tile_at<Tile<C, BV>>(sm, S::V + s * S::tv); };
  auto Gt = [&](int s) { return reinterpret_cast<float*>(sm + S::G + s * C * 4); };
  char* stage = sm + S::out + w.warp * Tile<RW, DK>::bytes;
  float4* xch = reinterpret_cast<float4*>(sm + S::xch) + w.warp * (RW * C / 4);
  const cuda::TileCopy<NT, Tile<C, DK>> copy_rows(tid);
  const cuda::TileCopy<NT, Tile<C, BV>> copy_u(tid);

  Frag<RW, KW> st;  // state rows row0 + v0.., key columns k0..
  if (from) st.each([&](int r, int c, float& x) { x = from[(w.v0 + r) * DK + w.k0 + c]; });
  else st.fill(0.f);
  // Sub-chunk n into buffer s; past the last sub-chunk the copies are zero-fills (no branch,
  // so the step is one block of straight-line code the compiler can schedule as a whole).
  auto issue = [&](int n, int s) {
    const bool live = n < a.NS;
    n = min(n, a.NS - 1);
    const int t0 = n * C;
    const int64_t ws0 = a.ws_row(b, h, n);
    copy_rows(Wt(s), a.W + ws0 * DK, DK, live ? C : 0);
    copy_rows(Kt(s), a.k + a.tok(b, t0, h) * DK, int64_t(a.H) * DK, live ? min(C, a.T - t0) : 0);
    copy_u(Ut(s), a.U + ws0 * DV + row0, DV, live ? C : 0);
    copy_g_async(Gt(s), a.G + ws0, tid, live);
  };
  for (int i = 0; i < STAGES - 1; ++i) {
    issue(i, i);
    cuda::cp_async_commit();
  }
  for (int n = 0; n < a.NS; ++n) {
    const int s = n % STAGES;
    cuda::cp_async_wait<STAGES - 2>();
    __syncthreads();  // sub-chunk n has landed; every warp is done with the buffer refilled next
    issue(n + STAGES - 1, (n + STAGES - 1) % STAGES);
    cuda::cp_async_commit();
    AFrags<KW> sa;  // the entering state rounded to bf16: operand of S W^T and the snapshot
    cuda::acc_to_a(st, sa);
    Frag<RW, C> vn;  // V_new^T: value rows, token columns
    vn.fill(0.f);
    cuda::mma_regs_acc<KW, Lay::Col>(vn, sa, Wt(s), 0, w.k0);
    store_state_rows<KW>(sa, stage, a.Hs + (a.ws_sub(b, h, n) * DV + row0 + w.v0) * DK + w.k0);
    add_pair<KS>(vn, w.kh, xch, xch + (1 - 2 * w.kh) * (RW * C / 4), w.pair_bar());
    Frag<RW, C> u;
    cuda::load_transposed(u, Ut(s), w.v0);
    vn.each([&](int r, int c, float& x) { x = u.x[0][c >> 3][(r >> 3) * 2 + (c & 1)] - x; });
    store_token_major<KS>(vn, w.kh * (C / KS), stage, a.Vn + a.ws_row(b, h, n) * DV + row0 + w.v0);
    const float* G = Gt(s);
    float e[C / 8][2];
    lane_decays(G, e);
    vn.each([&](int, int c, float& x) { x *= e[c >> 3][c & 1]; });
    AFrags<C> va;
    cuda::acc_to_a(vn, va);
    const float gl = expf(G[C - 1]);
    st.each([&](int, int, float& x) { x *= gl; });
    cuda::mma_regs_acc<C, Lay::Row>(st, va, Kt(s), w.k0);
  }
  if (to) st.each([&](int r, int c, float& x) { to[(w.v0 + r) * DK + w.k0 + c] = x; });
}

// Reverse sweep (B3) over every sub-chunk of (b, h), last first, rows [row0, row0 + 16 RG) of
// the gradient: from `from` (the block's rows of dS_out, or zero when null) to `to` (dS_in);
// writes dV_new over dV_new_local and the snapshots dHs.
template <int RG, int KS, int STAGES>
__device__ void row_reverse_sweep(const Args& a, int b, int h, int row0, const float* from, float* to, char* sm) {
  using S = RowSmem<RG, KS, STAGES, true>;
  constexpr int NT = S::NWB * 32, BV = S::BV, KW = DK / KS;
  const int tid = threadIdx.x;
  const RowWarp<RG, KS> w;
  auto Kt = [&](int s) { return tile_at<Tile<C, DK>>(sm, S::K + s * S::tk); };
  auto Wt = [&](int s) { return tile_at<Tile<C, DK>>(sm, S::W + s * S::tk); };
  auto Qt = [&](int s) { return tile_at<Tile<C, DK>>(sm, S::Q + s * S::tk); };
  auto dOt = [&](int s) { return tile_at<Tile<C, BV>>(sm, S::V + s * S::tv); };
  auto dVlt = [&](int s) { return tile_at<Tile<C, BV>>(sm, S::V2 + s * S::tv); };
  auto Gt = [&](int s) { return reinterpret_cast<float*>(sm + S::G + s * C * 4); };
  char* stage = sm + S::out + w.warp * Tile<RW, DK>::bytes;
  float4* xch = reinterpret_cast<float4*>(sm + S::xch) + w.warp * (RW * C / 4);
  const cuda::TileCopy<NT, Tile<C, DK>> copy_rows(tid);
  const cuda::TileCopy<NT, Tile<C, BV>> copy_v(tid);

  Frag<RW, KW> ds;
  if (from) ds.each([&](int r, int c, float& x) { x = from[(w.v0 + r) * DK + w.k0 + c]; });
  else ds.fill(0.f);
  auto issue = [&](int n, int s) {  // zero-fills for n < 0, as the forward's past its end
    const bool live = n >= 0;
    n = max(n, 0);
    const int t0 = n * C, nv = live ? min(C, a.T - t0) : 0;
    const int64_t ws0 = a.ws_row(b, h, n), r0 = a.tok(b, t0, h);
    copy_rows(Kt(s), a.k + r0 * DK, int64_t(a.H) * DK, nv);
    copy_rows(Wt(s), a.W + ws0 * DK, DK, live ? C : 0);
    copy_rows(Qt(s), a.q + r0 * DK, int64_t(a.H) * DK, nv);
    copy_v(dOt(s), a.dO + r0 * DV + row0, int64_t(a.H) * DV, nv);
    copy_v(dVlt(s), a.dVn + ws0 * DV + row0, DV, live ? C : 0);
    copy_g_async(Gt(s), a.G + ws0, tid, live);
  };
  for (int i = 0; i < STAGES - 1; ++i) {  // step i works on sub-chunk NS - 1 - i
    issue(a.NS - 1 - i, i);
    cuda::cp_async_commit();
  }
  for (int i = 0; i < a.NS; ++i) {
    const int n = a.NS - 1 - i, s = i % STAGES;
    cuda::cp_async_wait<STAGES - 2>();
    __syncthreads();
    issue(n - (STAGES - 1), (i + STAGES - 1) % STAGES);
    cuda::cp_async_commit();
    const float* G = Gt(s);
    AFrags<KW> da;  // dSe, the gradient of the state leaving sub-chunk n, rounded to bf16
    cuda::acc_to_a(ds, da);
    Frag<RW, C> dvn;  // (K dSe^T)^T: value rows, token columns
    dvn.fill(0.f);
    cuda::mma_regs_acc<KW, Lay::Col>(dvn, da, Kt(s), 0, w.k0);
    store_state_rows<KW>(da, stage, a.dHs + (a.ws_sub(b, h, n) * DV + row0 + w.v0) * DK + w.k0);
    // The part of the update that does not need this sub-chunk's dV_new: gamma_L dS + s (diag(gamma) dO)^T Q.
    AFrags<C> og;
    scaled_dO_operand(og, dOt(s), w.v0, G, a.scale);
    const float gl = expf(G[C - 1]);
    ds.each([&](int, int, float& x) { x *= gl; });
    cuda::mma_regs_acc<C, Lay::Row>(ds, og, Qt(s), w.k0);
    add_pair<KS>(dvn, w.kh, xch, xch + (1 - 2 * w.kh) * (RW * C / 4), w.pair_bar());
    Frag<RW, C> dl;
    cuda::load_transposed(dl, dVlt(s), w.v0);
    float e[C / 8][2];
    lane_decays(G, e);
    dvn.each([&](int r, int c, float& x) { x = dl.x[0][c >> 3][(r >> 3) * 2 + (c & 1)] + e[c >> 3][c & 1] * x; });
    store_token_major<KS>(dvn, w.kh * (C / KS), stage, a.dVn + a.ws_row(b, h, n) * DV + row0 + w.v0);
    dvn.each([&](int, int, float& x) { x = -x; });
    AFrags<C> nd;
    cuda::acc_to_a(dvn, nd);
    cuda::mma_regs_acc<C, Lay::Row>(ds, nd, Wt(s), w.k0);
  }
  if (to) ds.each([&](int r, int c, float& x) { to[(w.v0 + r) * DK + w.k0 + c] = x; });
}

#include "mixers/gdn/gdn_core_overlap.cuh"
#include "mixers/gdn/gdn_core_quarter_sweeps.cuh"

// Forward ST: grid (DV / (16 RG), H, B), RG x KS warps (KS = 4: the quarter sweeps; CW: and a
// copy warp; CB > 0: that multicasts to clusters of CB blocks; LINES: that copies whole tiles by
// lines, quarter_sweeps.cuh's copy_whole_tile). STAGES: sub-chunks of tiles in flight.
template <int RG, int KS, bool CW, int CB = 0, int STAGES = row_stages<RG, KS, false>(), bool LINES = false>
__global__ void __launch_bounds__(row_threads<RG, KS, CW>()) row_forward_kernel(Args a) {
  extern __shared__ __align__(128) char sm[];
  const int b = blockIdx.z, h = blockIdx.y, row0 = blockIdx.x * RG * RW;
  const int64_t tile = ((int64_t(b) * a.H + h) * DV + row0) * DK;
  const float* from = a.S_in ? a.S_in + tile : nullptr;
  float* to = a.S_out ? a.S_out + tile : nullptr;
  if constexpr (KS == KQ) quarter_forward_sweep<RG, STAGES, CW, CB, false, LINES>(a, b, h, row0, from, to, sm);
  else row_forward_sweep<RG, KS, STAGES>(a, b, h, row0, from, to, sm);
  if constexpr (CB > 0) cuda::cluster_sync();  // no block leaves while a peer may still reach its shared memory
}

// B3, and B1' when the forward is recomputed: grid ((recompute ? 2 : 1) DV / (16 RG), H, B);
// with recompute the first half of the blocks re-run the forward sweep (Hs, V_new for B4) on
// SMs of their own, beside the reverse sweeps. kCount: both count their segments for the overlap
// (gdn_core_overlap.cuh).
template <int RG, int KS, bool CW, int CB = 0, bool kCount = false, bool LINES = false>
__global__ void __launch_bounds__(row_threads<RG, KS, CW>()) row_backward_kernel(Args a, bool recompute) {
  extern __shared__ __align__(128) char sm[];
  constexpr int tiles = DV / (RG * RW);
  const int b = blockIdx.z, h = blockIdx.y, x = blockIdx.x;
  const bool forward = recompute && x < tiles;
  const int row0 = (forward || !recompute ? x : x - tiles) * RG * RW;
  const int64_t tile = ((int64_t(b) * a.H + h) * DV + row0) * DK;
  const float* from = forward ? (a.S_in ? a.S_in + tile : nullptr) : (a.dS_out ? a.dS_out + tile : nullptr);
  constexpr int fwd_stages = row_stages<RG, KS, false>(), rev_stages = row_stages<RG, KS, true>();
  if constexpr (KS == KQ) {
    if (forward) quarter_forward_sweep<RG, fwd_stages, CW, CB, kCount, LINES>(a, b, h, row0, from, nullptr, sm);
    else quarter_reverse_sweep<RG, rev_stages, CW, CB, kCount, LINES>(a, b, h, row0, from, a.dS_in + tile, sm);
    if constexpr (CB > 0) cuda::cluster_sync();
  } else {
    if (forward) row_forward_sweep<RG, KS, fwd_stages>(a, b, h, row0, from, nullptr, sm);
    else row_reverse_sweep<RG, KS, rev_stages>(a, b, h, row0, from, a.dS_in + tile, sm);
  }
}

// ---------------------------------------------------------------------------------------
// Split core: each (batch, head)'s sub-chunks are cut into NP pieces of SP sub-chunks that are
// swept in parallel. A sub-chunk maps the state as S <- S M_n + B_n (M_n = gamma_L I - W^T
// diag(e) K, B_n = U^T diag(e) K), so a piece maps it as S <- S A_p + U_p with A_p the product
// of its M_n (in order) and U_p its map of a zero state. Forward:
//   1. piece_maps: per piece, U_p (the sweep from zero, value rows) and A_p (the same sweep
//      from I with U = 0, key rows); fp32 results, nothing truncated.
//   2. fold: S_0 = S_in, S_{p+1} = S_p A_p + U_p in fp32, in piece order; S_out = S_NP.
//   3. piece_sweeps: per piece, the ordinary sweep from S_p (writes V_new and Hs).
// Backward: the reverse step is dS <- dS M_n^T + (terms without dS), so a piece maps the
// gradient as dS <- dS A_p^T + V_p: V_p by the reverse sweep from zero, the fold last piece
// first (dS_in = D_0), then the reverse sweep of each piece from its folded gradient.
// S_out and dS_in always come from the fold, for every NP, so cutting a call at a multiple of
// the piece length repeats the uncut call's operations: bitwise neutral.
// ---------------------------------------------------------------------------------------
constexpr int PIECE_STAGES = 2;  // pipeline depth of the piece sweeps (two or more blocks per SM)

// Grid (NP * (DV + DK) / BV, H, B): block x = p * tiles + tile; tiles < DV / BV map a zero state
// (to Up), the rest are rows of the transition (to Ap).
template <int BV>
__global__ void __launch_bounds__(SWEEP_WARPS * 32) piece_maps_kernel(Args a) {
  extern __shared__ __align__(128) char sm[];
  constexpr int tiles = (DV + DK) / BV;
  const int p = blockIdx.x / tiles, t = blockIdx.x % tiles, h = blockIdx.y, b = blockIdx.z;
  const int n0 = p * a.SP, n1 = min(n0 + a.SP, a.NS);
  const bool transition = t >= DV / BV;
  const int row0 = (transition ? t - DV / BV : t) * BV;
  const FwdSpan sp{n0, n1, row0, nullptr, (transition ? a.Ap : a.Up) + a.piece_row(b, h, p, row0), transition, false};
  forward_sweep<BV, PIECE_STAGES, SWEEP_WARPS>(a, b, h, sp, sm, threadIdx.x, 1);
}

// Grid (NP * DV / BV, H, B): piece p's sweep from the folded state (S_in for p = 0).
template <int BV>
__global__ void __launch_bounds__(SWEEP_WARPS * 32) piece_sweeps_kernel(Args a) {
  extern __shared__ __align__(128) char sm[];
  constexpr int tiles = DV / BV;
  const int p = blockIdx.x / tiles, row0 = (blockIdx.x % tiles) * BV, h = blockIdx.y, b = blockIdx.z;
  const int n0 = p * a.SP, n1 = min(n0 + a.SP, a.NS);
  const int64_t tile = ((int64_t(b) * a.H + h) * DV + row0) * DK;
  const float* from = p > 0 ? a.Sp + a.piece_row(b, h, p, row0) : a.S_in ? a.S_in + tile : nullptr;
  forward_sweep<BV, PIECE_STAGES, SWEEP_WARPS>(a, b, h, {n0, n1, row0, from, nullptr, false, true}, sm, threadIdx.x, 1);
}

// Grid (NP * DV / BV, H, B): piece p's reverse sweep from a zero gradient (V_p, to Up) or, with
// write_ws, from the folded gradient leaving it (dS_out for the last piece).
template <int BV>
__global__ void __launch_bounds__(SWEEP_WARPS * 32) piece_reverse_kernel(Args a, bool from_fold) {
  extern __shared__ __align__(128) char sm[];
  constexpr int tiles = DV / BV;
  const int p = blockIdx.x / tiles, row0 = (blockIdx.x % tiles) * BV, h = blockIdx.y, b = blockIdx.z;
  const int n0 = p * a.SP, n1 = min(n0 + a.SP, a.NS);
  const int64_t tile = ((int64_t(b) * a.H + h) * DV + row0) * DK;
  BwdSpan sp{n0, n1, row0, nullptr, a.Up + a.piece_row(b, h, p, row0), false};
  if (from_fold) {
    sp.from = p + 1 < a.NP ? a.Sp + a.piece_row(b, h, p, row0) : a.dS_out ? a.dS_out + tile : nullptr;
    sp.to = nullptr, sp.write_ws = true;
  }
  backward_sweep<BV, PIECE_STAGES, SWEEP_WARPS>(a, b, h, sp, sm, threadIdx.x, 1);
}

constexpr int FOLD_ROWS = 16;    // state rows per fold block: DV / 16 blocks per (batch, head)
constexpr int FOLD_LD = DK + 1;  // padded rows of A_p: A[k][j] and A[j][k] reads are both conflict-free

struct FoldSmem {
  static constexpr int A = 0;                               // A_p, two buffers, fp32 [128][FOLD_LD]
  static constexpr int U = A + 2 * DK * FOLD_LD * 4;        // U_p's rows, two buffers, fp32 [FOLD_ROWS][128]
  static constexpr int X = U + 2 * FOLD_ROWS * DK * 4;      // the running rows, fp32 [FOLD_ROWS][128]
  static constexpr int bytes = X + FOLD_ROWS * DK * 4;
};

// The fold in fp32, one block per FOLD_ROWS state rows of one (batch, head), 256 threads
// (thread: column j, rows i0..i0+7); A_{p+1} and U_{p+1} load (cp.async) while step p computes.
// Forward: X_0 = S_in, X_{p+1} = X_p A_p + U_p, Sp[p] = X_p (p >= 1), S_out = X_NP.
// Backward (TRANSPOSED): X_NP = dS_out, X_p = X_{p+1} A_p^T + V_p (V_p in Up), Sp[p] = X_{p+1}
// (p < NP - 1), dS_in = X_0. A null start is zero and its first step is X = U exactly. Each
// sum starts from U and adds k = 0..127 in order: deterministic.
template <bool TRANSPOSED>
__global__ void __launch_bounds__(256) fold_kernel(Args a) {
  extern __shared__ __align__(16) char sm[];
  using S = FoldSmem;
  float* X = reinterpret_cast<float*>(sm + S::X);
  const int r0 = blockIdx.x * FOLD_ROWS, h = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  const int j = tid & (DK - 1), i0 = (tid >> 7) * 8;
  const int64_t tile = ((int64_t(b) * a.H + h) * DV + r0) * DK;
  const float* start = TRANSPOSED ? a.dS_out : a.S_in;
  float* end = TRANSPOSED ? a.dS_in : a.S_out;
  auto piece = [&](int step) { return TRANSPOSED ? a.NP - 1 - step : step; };
  auto fetch = [&](int step) {
    const int p = piece(step), buf = step & 1;
    const float* Am = a.Ap + a.piece_row(b, h, p, 0);
    const float* Um = a.Up + a.piece_row(b, h, p, r0);
    float* As = reinterpret_cast<float*>(sm + S::A) + buf * DK * FOLD_LD;
    float* Us = reinterpret_cast<float*>(sm + S::U) + buf * FOLD_ROWS * DK;
    for (int e = tid; e < DK * DK; e += 256) cuda::cp_async4(As + (e / DK) * FOLD_LD + e % DK, Am + e);
    for (int e = tid; e < FOLD_ROWS * DK; e += 256) cuda::cp_async4(Us + e, Um + e);
  };
  bool zero = start == nullptr;
#pragma unroll
  for (int i = 0; i < 8; ++i) X[(i0 + i) * DK + j] = zero ? 0.f : start[tile + (i0 + i) * DK + j];
  fetch(0);
  cuda::cp_async_commit();
  for (int step = 0; step < a.NP; ++step) {
    const int p = piece(step);
    if (step + 1 < a.NP) fetch(step + 1);
    cuda::cp_async_commit();
    cuda::cp_async_wait<1>();
    __syncthreads();  // A_p and U_p have landed; X holds the last step's rows
    if (step > 0) {   // the state the fold hands piece p's sweep
      float* dst = a.Sp + a.piece_row(b, h, p, r0);
#pragma unroll
      for (int i = 0; i < 8; ++i) dst[(i0 + i) * DK + j] = X[(i0 + i) * DK + j];
    }
    const float* As = reinterpret_cast<const float*>(sm + S::A) + (step & 1) * DK * FOLD_LD;
    const float* Us = reinterpret_cast<const float*>(sm + S::U) + (step & 1) * FOLD_ROWS * DK;
    float acc[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = Us[(i0 + i) * DK + j];
    if (!zero) {
      for (int k = 0; k < DK; k += 4) {
        float4 x[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) x[i] = *reinterpret_cast<const float4*>(X + (i0 + i) * DK + k);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          const float m = TRANSPOSED ? As[j * FOLD_LD + k + kk] : As[(k + kk) * FOLD_LD + j];
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const float xv = kk == 0 ? x[i].x : kk == 1 ? x[i].y : kk == 2 ? x[i].z : x[i].w;
            acc[i] = fmaf(xv, m, acc[i]);
          }
        }
      }
    }
    __syncthreads();  // every thread is done reading X and this step's buffers
#pragma unroll
    for (int i = 0; i < 8; ++i) X[(i0 + i) * DK + j] = acc[i];
    zero = false;
  }
  if (end) {
#pragma unroll
    for (int i = 0; i < 8; ++i) end[tile + (i0 + i) * DK + j] = X[(i0 + i) * DK + j];
  }
}

// ---------------------------------------------------------------------------------------
// Out: one block per (sub-chunk, head, batch), 8 warps.
// ---------------------------------------------------------------------------------------
struct OutSmem {
  static constexpr int q = 0;
  static constexpr int k = q + Tile<C, DK>::bytes;
  static constexpr int hs = k + Tile<C, DK>::bytes;
  static constexpr int vn = hs + Tile<DV, DK>::bytes;
  static constexpr int P = vn + Tile<C, DV>::bytes;
  static constexpr int G = P + Tile<C, C>::bytes;
  static constexpr int bytes = G + C * 4;
};

template <bool kPlans>
__global__ void __launch_bounds__(256) out_kernel(Args a) {
  using S = OutSmem;
  extern __shared__ __align__(128) char sm[];
  const int n = blockIdx.x, h = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  const int wm = (tid >> 5) & 3, wn = tid >> 7;
  const int t0 = n * C, nv = min(C, a.T - t0);
  const int64_t r0 = a.tok(b, t0, h), ws0 = a.ws_row(b, h, n);
  auto Qs = tile_at<Tile<C, DK>>(sm, S::q), Ks = tile_at<Tile<C, DK>>(sm, S::k);
  auto Hs = tile_at<Tile<DV, DK>>(sm, S::hs);
  auto Vn = tile_at<Tile<C, DV>>(sm, S::vn);
  auto Ps = tile_at<Tile<C, C>>(sm, S::P);
  float* G = reinterpret_cast<float*>(sm + S::G);

  const BlockCopy<Tile<C, DK>, kPlans> copy_rows(tid);  // DV = DK: one plan for q, k and V_new
  const BlockCopy<Tile<DV, DK>, kPlans> copy_state(tid);
  copy_rows(Qs, a.q + r0 * DK, int64_t(a.H) * DK, nv);
  copy_rows(Ks, a.k + r0 * DK, int64_t(a.H) * DK, nv);
  copy_state(Hs, a.Hs + a.ws_sub(b, h, n) * DV * DK, DK);
  copy_rows(Vn, a.Vn + ws0 * DV, DV);
  cuda::load_floats_async<256>(G, a.G + ws0, C, tid);
  cuda::cp_async_commit();
  cuda::cp_async_wait_all();
  __syncthreads();
  {
    Frag<16, 32> qk;
    qk.fill(0.f);
    mma_acc<DK, Lay::Row, Lay::Col>(qk, Qs, wm * 16, Ks, wn * 32);
    qk.each([&](int r, int c, float& x) {
      r += wm * 16, c += wn * 32;
      *Ps.at(r, c) = __float2bfloat16(c <= r ? a.scale * x * expf(G[r] - G[c]) : 0.f);
    });
  }
  Frag<16, DV / 2> o;
  o.fill(0.f);
  mma_acc<DK, Lay::Row, Lay::Col>(o, Qs, wm * 16, Hs, wn * DV / 2);
  o.each([&](int r, int, float& x) { x *= a.scale * expf(G[wm * 16 + r]); });
  __syncthreads();
  mma_acc<C, Lay::Row, Lay::Row>(o, Ps, wm * 16, Vn, wn * DV / 2);
  store_rows(o, a.o + r0 * DV, int64_t(a.H) * DV, wm * 16, wn * DV / 2, nv);
}

// ---------------------------------------------------------------------------------------
// B4: every remaining gradient of one sub-chunk (MATH.md 4.5). One block per (sub-chunk,
// head, batch), 8 warps; dq and dk stay in registers, per-token scalars are reduced in a
// fixed order (quad shuffles, then shared memory).
// The entering state S and the leaving-state gradient dSe (128 x 128 each) are only ever
// contracted over their value rows, so they stream through a two-slot ring of SR-row slabs
// (the next slab loads while the current one is used) instead of sitting in shared memory
// whole: with SR = 16 a block needs 107 KiB and two blocks share an SM, so one block's loads
// overlap the other's arithmetic (with the whole state resident, 200 KiB, one block per SM
// waited on its loads). dW = -dV_new S takes a second pass over S (from L2) so that no more
// than two 16 x 64 accumulators per warp are live at a time. The products add over the value
// rows in the same order as whole-K products, so SR does not change dq, dk or dv.
// ---------------------------------------------------------------------------------------
// B4's products (GdnCudaConfig::b4_mma): mma.sync on ldmatrix fragments of padded row-major tiles
// (each warp its 16 rows), or wgmma, each warpgroup reading all 64 rows of core-matrix tiles
// straight from shared memory (sm_90a; kernels/cuda/wgmma_tile.cuh). Both add the same K steps
// in the same order. issue() may return before its product is done (wgmma: the tensor cores run
// on while the warps do other work; acc and the operands stay untouched until wait()); acc() is
// issue() then wait(). sync() is the block barrier, with the fence wgmma's reads need before it.
struct MmaSyncProducts {
  template <int R, int CC>
  using TileT = Tile<R, CC>;
  template <int K, Lay LA, Lay LB, int WN, class TA, class TB>
  __device__ static void issue(Frag<16, WN>& f, TA a, int m0, TB b, int n0) {
    mma_acc<K, LA, LB>(f, a, m0, b, n0);
  }
  template <int K, Lay LA, Lay LB, int WN, class TA, class TB>
  __device__ static void acc(Frag<16, WN>& f, TA a, int m0, TB b, int n0) {
    mma_acc<K, LA, LB>(f, a, m0, b, n0);
  }
  __device__ static void wait() {}
  __device__ static void sync() { __syncthreads(); }
};
struct WgmmaProducts {
  template <int R, int CC>
  using TileT = cuda::CoreTile<R, CC>;
  // The warp's rows m0 = 16 (warp % 4) are implied: its warpgroup multiplies all 64.
  template <int K, Lay LA, Lay LB, int WN, class TA, class TB>
  __device__ static void issue(Frag<16, WN>& f, TA a, int, TB b, int n0) {
    cuda::wgmma_issue<K, LA, LB>(f, a, b, n0);
  }
  template <int K, Lay LA, Lay LB, int WN, class TA, class TB>
  __device__ static void acc(Frag<16, WN>& f, TA a, int, TB b, int n0) {
    cuda::wgmma_acc<K, LA, LB>(f, a, b, n0);
  }
  __device__ static void wait() { cuda::wgmma_wait(); }
  __device__ static void sync() {
    cuda::fence_for_wgmma();
    __syncthreads();
  }
};

template <int SR, class P>
struct B4Smem {
  using TK = typename P::template TileT<C, DK>;  // also the C x DV tiles (DV = DK)
  using TC = typename P::template TileT<C, C>;
  using TS = typename P::template TileT<SR, DK>;
  static constexpr int tk = TK::bytes, tc = TC::bytes, ts = TS::bytes;
  // Phase 1 (state terms and the Out terms): q, k, dO, V_new, dV_new and the ring of S / dSe
  // slabs. Phase 2 reuses what phase 1 no longer reads: dW and later M1 where q was, v and
  // later X where dO was, T where V_new was, dT (and dPG before it) in the ring.
  static constexpr int q = 0, k = q + tk, dO = k + tk, vn = dO + tk, dvn = vn + tk, ring = dvn + tk;
  static constexpr int dW = q, M1 = q, v = dO, X = dO, T = vn, dPG = ring, dT = ring;
  static constexpr int slot = 2 * ts;  // one S slab and one dSe slab
  static constexpr int vec = ring + 2 * slot;
  // Per-token vectors of C floats; the 2-wide ones are per warp column (wn), vYc per warp row (wm).
  enum { vG, vGam, vBeta, vQdq, vKdk = vQdq + 2, vM = vKdk + 2, vTkb = vM + 2, vTvb = vTkb + 2, vYr = vTvb + 2,
         vYc = vYr + 2, vdG = vYc + 4, vRed, nvec };
  static constexpr int bytes = vec + nvec * C * 4;
  static_assert(2 * slot >= tc, "dPG and dT must fit in the ring");
  static constexpr int blocks_per_sm = 2 * (bytes + 1024) <= 228 * 1024 ? 2 : 1;
};

// Streams the NSL = DV / SR slabs of the value rows through the ring's two slots: issue(j, slot)
// starts slab j's copies, body(j, slot) uses it. One block barrier per slab: it publishes slab
// j and frees the slot slab j + 1 goes to (its previous slab's body is done).
template <int SR, class P, class Issue, class Body>
__device__ void stream_slabs(Issue&& issue, Body&& body) {
  constexpr int NSL = DV / SR;
  for (int j = 0; j < NSL; ++j) {
    cuda::cp_async_wait_all();  // slab j (and anything committed before it)
    P::sync();
    if (j + 1 < NSL) issue(j + 1, (j + 1) & 1);
    cuda::cp_async_commit();
    body(j, j & 1);
  }
  P::sync();  // the ring is free again
}

// Tile t seen from its column c0 on (same row stride): the operand of a product over those columns.
template <class T>
__device__ T columns_from(T t, int c0) {
  return T{t.p + c0};
}

// Epilogue pieces b4_kernel and b4_ring_kernel share, so their bits stay the same.

// The bf16 halves of a 32-bit word as fp32 (exact, as __bfloat162float), one instruction each.
__device__ __forceinline__ float lo_bf16(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi_bf16(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
// x0 y0 + x1 y1 as the compiler fuses it in these pieces (the second product rounded, the first
// fused with it), spelled out for the lean epilogues of b4_ring_kernel so their bits stay these.
__device__ __forceinline__ float pair_dot(float x0, float y0, float x1, float y1) {
  return __fmaf_rn(x0, y0, __fmul_rn(x1, y1));
}

// Adds one thread's share of <dSe, S> from eight columns of slab row r (c, c + 1, ..., c + 7);
// kLean: the same sum on fewer instructions.
template <bool kLean = false, class TS>
__device__ __forceinline__ void add_slab_dot8(float& sds, TS Sslab, TS dSslab, int r, int c) {
  const uint4 xs = *reinterpret_cast<const uint4*>(Sslab.at(r, c));
  const uint4 xd = *reinterpret_cast<const uint4*>(dSslab.at(r, c));
  const uint32_t ws[4] = {xs.x, xs.y, xs.z, xs.w}, wd[4] = {xd.x, xd.y, xd.z, xd.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    if constexpr (kLean) {
      sds = __fadd_rn(sds, pair_dot(lo_bf16(wd[e]), lo_bf16(ws[e]), hi_bf16(wd[e]), hi_bf16(ws[e])));
    } else {
      const float2 fs = cuda::unpack2(ws[e]), fd = cuda::unpack2(wd[e]);
      sds += fd.x * fs.x + fd.y * fs.y;
    }
  }
}

// Y's sums from a lane's partial sums of a 16 x 32 fragment: row sums rs (rows m0 + lane / 4 and
// + 8) to yr, column sums cs (columns wn * 32 + 8 j + 2 (lane % 4) + p) over the warp's 16 rows to yc.
__device__ __forceinline__ void store_y_sums(float (&rs)[2], const float (&cs)[4][2], int lane, int m0, int wn,
                                             float* yr, float* yc) {
  rs[0] = cuda::quad_sum(rs[0]), rs[1] = cuda::quad_sum(rs[1]);
  if ((lane & 3) == 0) {
    yr[m0 + (lane >> 2)] = rs[0];
    yr[m0 + (lane >> 2) + 8] = rs[1];
  }
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int p = 0; p < 2; ++p) {  // the warp's 16 rows of column c are in lanes with equal lane % 4
      float x = cs[j][p];
      x += __shfl_xor_sync(0xffffffffu, x, 4);
      x += __shfl_xor_sync(0xffffffffu, x, 8);
      x += __shfl_xor_sync(0xffffffffu, x, 16);
      if (lane < 4) yc[wn * 32 + j * 8 + 2 * lane + p] = x;
    }
}

// Token r's scalars from the per-warp partial sums in the vectors vec(i): x = dbeta, y = dG before
// the state-decay terms and the reverse cumsum.
template <class S, class Vec>
__device__ __forceinline__ float2 token_dbeta_dG(Vec&& vec, const float* beta, const float* gam, int r) {
  const float tkb = vec(S::vTkb)[r] + vec(S::vTkb + 1)[r], tvb = vec(S::vTvb)[r] + vec(S::vTvb + 1)[r];
  const float qdq = vec(S::vQdq)[r] + vec(S::vQdq + 1)[r], kdk = vec(S::vKdk)[r] + vec(S::vKdk + 1)[r];
  const float yr = vec(S::vYr)[r] + vec(S::vYr + 1)[r];
  const float yc = ((vec(S::vYc)[r] + vec(S::vYc + 1)[r]) + vec(S::vYc + 2)[r]) + vec(S::vYc + 3)[r];
  return make_float2(gam[r] * tkb + tvb + yr, qdq - kdk + beta[r] * gam[r] * tkb + beta[r] * yr - yc);
}

template <int SR, class P, bool kPlans>
__global__ void __launch_bounds__(256, B4Smem<SR, P>::blocks_per_sm) b4_kernel(Args a) {
  using S = B4Smem<SR, P>;
  using TK = typename S::TK;
  using TC = typename S::TC;
  using TS = typename S::TS;
  constexpr int HK = DK / 2, HV = DV / 2;
  extern __shared__ __align__(128) char sm[];
  const int n = a.n0 + blockIdx.x, h = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  const int warp = tid >> 5, lane = tid & 31, wm = warp & 3, wn = warp >> 2, m0 = wm * 16;
  const int t0 = n * C, nv = min(C, a.T - t0);
  const int64_t r0 = a.tok(b, t0, h), ws0 = a.ws_row(b, h, n), sub = a.ws_sub(b, h, n);
  auto Qs = tile_at<TK>(sm, S::q), Ks = tile_at<TK>(sm, S::k);
  auto dOs = tile_at<TK>(sm, S::dO), Vns = tile_at<TK>(sm, S::vn);
  auto dVns = tile_at<TK>(sm, S::dvn), Vs = tile_at<TK>(sm, S::v);
  auto dWs = tile_at<TK>(sm, S::dW);
  auto Ts = tile_at<TC>(sm, S::T), dTs = tile_at<TC>(sm, S::dT);
  auto M1s = tile_at<TC>(sm, S::M1), Xs = tile_at<TC>(sm, S::X);
  auto dPGs = tile_at<TC>(sm, S::dPG);
  auto Sslab = [&](int slot) { return tile_at<TS>(sm, S::ring + slot * S::slot); };
  auto dSslab = [&](int slot) { return tile_at<TS>(sm, S::ring + slot * S::slot + S::ts); };
  auto vec = [&](int i) { return reinterpret_cast<float*>(sm + S::vec) + i * C; };
  float *G = vec(S::vG), *gam = vec(S::vGam), *beta = vec(S::vBeta);
  const bf16 *Hs = a.Hs + sub * DV * DK, *dHs = a.dHs + sub * DV * DK;
  const BlockCopy<TS, kPlans> copy_slab(tid);
  const BlockCopy<TK, kPlans> copy_rows(tid);
  const BlockCopy<TC, kPlans> copy_T(tid);
  auto issue_S = [&](int j, int slot) { copy_slab(Sslab(slot), Hs + j * SR * DK, DK); };
  auto issue_S_dSe = [&](int j, int slot) {
    issue_S(j, slot);
    copy_slab(dSslab(slot), dHs + j * SR * DK, DK);
  };

  const int64_t ldk = int64_t(a.H) * DK, ldv = int64_t(a.H) * DV;
  copy_rows(Qs, a.q + r0 * DK, ldk, nv);
  copy_rows(Ks, a.k + r0 * DK, ldk, nv);
  copy_rows(dOs, a.dO + r0 * DV, ldv, nv);
  copy_rows(Vns, a.Vn + ws0 * DV, DV);
  copy_rows(dVns, a.dVn + ws0 * DV, DV);
  cuda::load_floats_async<256>(G, a.G + ws0, C, tid);
  issue_S_dSe(0, 0);
  cuda::cp_async_commit();
  if (tid < C) beta[tid] = tid < nv ? a.beta[r0 + int64_t(tid) * a.H] : 0.f;
  const float s = a.scale;

  // dG from the Out terms (inter: dO_r . O1_r; intra: rowsum - colsum of dP ⊙ P) and from
  // the state write (-m_c) adds up to q_r . dq_r - k_r . dk_r with dq, dk as they stand
  // after the intra term, so it is read off the accumulators instead of C x C scratch.
  Frag<16, HK> dq, dk;
  // Pass 1 over the slabs: dq = dO S (Out, inter-chunk term), dk = V_new dSe (state write),
  // and this thread's share of <dSe, S> (dG_L).
  dq.fill(0.f);
  dk.fill(0.f);
  float sds = 0.f;
  stream_slabs<SR, P>(issue_S_dSe, [&](int j, int slot) {
    P::template issue<SR, Lay::Row, Lay::Row>(dq, columns_from(dOs, j * SR), m0, Sslab(slot), wn * HK);
    P::template issue<SR, Lay::Row, Lay::Row>(dk, columns_from(Vns, j * SR), m0, dSslab(slot), wn * HK);
    for (int i = tid; i < SR * DK / 8; i += 256)
      add_slab_dot8(sds, Sslab(slot), dSslab(slot), i / (DK / 8), (i % (DK / 8)) * 8);
    P::wait();
  });
  if (tid < C) gam[tid] = expf(G[tid]);
  {
    const float acc = warp_sum(sds);
    if (lane == 0) vec(S::vRed)[warp] = acc;
  }
  P::sync();
  const float GL = G[C - 1];
  {  // Out, intra-chunk term: dPG = s (dO V_new^T) ⊙ Gam, causal incl. the diagonal (its
     // product runs while dq and dk are scaled)
    Frag<16, 32> dp;
    dp.fill(0.f);
    P::template issue<DV, Lay::Row, Lay::Col>(dp, dOs, m0, Vns, wn * 32);
    dq.each([&](int r, int, float& x) { x *= s * gam[m0 + r]; });
    dk.each([&](int r, int, float& x) { x *= expf(GL - G[m0 + r]); });
    row_dot(dk, Ks, m0, wn * HK, vec(S::vM + wn));  // m_c = k_c . dk_c also feeds dG_L
    P::wait();
    dp.each([&](int r, int c, float& x) {
      r += m0, c += wn * 32;
      *dPGs.at(r, c) = __float2bfloat16(c <= r ? s * x * expf(G[r] - G[c]) : 0.f);
    });
  }
  P::sync();
  P::template issue<C, Lay::Row, Lay::Row>(dq, dPGs, m0, Ks, wn * HK);
  P::template acc<C, Lay::Col, Lay::Row>(dk, dPGs, m0, Qs, wn * HK);
  row_dot(dq, Qs, m0, wn * HK, vec(S::vQdq + wn));
  row_dot(dk, Ks, m0, wn * HK, vec(S::vKdk + wn));
  store_rows(dq, a.dq + r0 * DK, ldk, m0, wn * HK, nv);
  P::sync();  // q, dO, V_new and dPG are free: phase 2's operands go there
  copy_rows(Vs, a.v + r0 * DV, ldv, nv);
  copy_T(Ts, a.Tm + sub * C * C, C);
  issue_S(0, 0);
  cuda::cp_async_commit();
  {  // Pass 2 over the slabs: dW = -dV_new S, to where q was
    Frag<16, HK> t;
    t.fill(0.f);
    stream_slabs<SR, P>(issue_S, [&](int j, int slot) {
      P::template acc<SR, Lay::Row, Lay::Row>(t, columns_from(dVns, j * SR), m0, Sslab(slot), wn * HK);
    });
    t.each_pair([&](int r, int c, float& x0, float& x1) { put2(dWs.at(m0 + r, wn * HK + c), -x0, -x1); });
  }
  P::sync();
  {  // dT = dW Kb^T + dU Vb^T (strictly lower part is all that matters)
    Frag<16, 32> ta, tb;
    ta.fill(0.f);
    tb.fill(0.f);
    P::template issue<DK, Lay::Row, Lay::Col>(ta, dWs, m0, Ks, wn * 32);
    P::template acc<DV, Lay::Row, Lay::Col>(tb, dVns, m0, Vs, wn * 32);
    int idx = 0;
    ta.each([&](int r, int c, float& x) {
      const float y = tb.x[0][idx / 4][idx % 4];
      ++idx;
      r += m0, c += wn * 32;
      *dTs.at(r, c) = __float2bfloat16(c < r ? beta[c] * (gam[c] * x + y) : 0.f);
    });
  }
  {  // dKb = T^T dW
    Frag<16, HK> t;
    t.fill(0.f);
    P::template acc<C, Lay::Col, Lay::Row>(t, Ts, m0, dWs, wn * HK);
    row_dot(t, Ks, m0, wn * HK, vec(S::vTkb + wn));
    int idx = 0;
    dk.each([&](int r, int, float& x) {
      x += beta[m0 + r] * gam[m0 + r] * t.x[0][idx / 4][idx % 4];
      ++idx;
    });
  }
  {  // dVb = T^T dU, dv = beta dVb
    Frag<16, HV> t;
    t.fill(0.f);
    P::template acc<C, Lay::Col, Lay::Row>(t, Ts, m0, dVns, wn * HV);
    row_dot(t, Vs, m0, wn * HV, vec(S::vTvb + wn));
    t.each([&](int r, int, float& x) { x *= beta[m0 + r]; });
    store_rows(t, a.dv + r0 * DV, ldv, m0, wn * HV, nv);
  }
  P::sync();
  {  // dA = -T^T dT T^T, first M1 = T^T dT
    Frag<16, 32> m;
    m.fill(0.f);
    P::template acc<C, Lay::Col, Lay::Row>(m, Ts, m0, dTs, wn * 32);
    m.each_pair([&](int r, int c, float& x0, float& x1) { put2(M1s.at(m0 + r, wn * 32 + c), x0, x1); });
  }
  P::sync();
  {  // A = beta_r (K K^T) ⊙ Gam: Y = dA ⊙ KK ⊙ Gam (its row sums and beta-weighted column
     // sums, in registers), X = beta_r dA ⊙ Gam
    Frag<16, 32> da, kk;
    da.fill(0.f);
    kk.fill(0.f);
    P::template issue<C, Lay::Row, Lay::Col>(da, M1s, m0, Ts, wn * 32);
    P::template acc<DK, Lay::Row, Lay::Col>(kk, Ks, m0, Ks, wn * 32);
    float rs[2] = {0.f, 0.f}, cs[4][2] = {};
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = m0 + (lane >> 2) + (e >> 1) * 8, c = wn * 32 + j * 8 + 2 * (lane & 3) + (e & 1);
        const float x = da.x[0][j][e];
        float y = 0.f, xx = 0.f;
        if (c < r) {
          const float gm = expf(G[r] - G[c]);
          y = -x * kk.x[0][j][e] * gm;
          xx = -beta[r] * x * gm;
        }
        rs[e >> 1] += y;
        cs[j][e & 1] += beta[r] * y;
        *Xs.at(r, c) = __float2bfloat16(xx);
      }
    store_y_sums(rs, cs, lane, m0, wn, vec(S::vYr + wn), vec(S::vYc + wm));
  }
  P::sync();
  P::template issue<C, Lay::Row, Lay::Row>(dk, Xs, m0, Ks, wn * HK);
  P::template acc<C, Lay::Col, Lay::Row>(dk, Xs, m0, Ks, wn * HK);
  store_rows(dk, a.dk + r0 * DK, ldk, m0, wn * HK, nv);
  if (tid < C) {  // per-token scalars: dbeta, and dG before the reverse cumsum
    const int r = tid;
    const float2 dbeta_dG = token_dbeta_dG<S>(vec, beta, gam, r);
    float dG = dbeta_dG.y;
    if (r == C - 1) {  // the sub-chunk's last row also carries the state-decay terms
      float ms = 0.f, ss = 0.f;
      for (int c = 0; c < C; ++c) ms += vec(S::vM)[c] + vec(S::vM + 1)[c];
      for (int w = 0; w < 8; ++w) ss += vec(S::vRed)[w];
      dG += gam[C - 1] * ss + ms;
    }
    vec(S::vdG)[r] = dG;
    if (r < nv) a.dbeta[r0 + int64_t(r) * a.H] = dbeta_dG.x;
  }
  P::sync();
  if (tid < nv) {  // dg = reverse cumsum of dG within the sub-chunk
    float acc = 0.f;
    for (int r = C - 1; r >= tid; --r) acc += vec(S::vdG)[r];
    a.dg[r0 + int64_t(tid) * a.H] = acc;
  }
}

#include "mixers/gdn/gdn_core_b4_ring.cuh"

// ---------------------------------------------------------------------------------------
// Host side
// ---------------------------------------------------------------------------------------
void cuda_check(cudaError_t e, const char* what) {
  SF_CHECK(e == cudaSuccess, "GDN CUDA core: ", what, " failed: ", cudaGetErrorString(e));
}

// Sub-chunks per piece of the split core for these dims (the whole sequence when not split).
// Depends on batch x heads and the config only, never on len: the piece grid of a call is then
// the same as that of any longer call it was cut from at a multiple of the piece length.
// The config's piece length in tokens (0 resolved through the environment), or kUnsplit.
int piece_len_of(const GdnCudaConfig& cfg) {
  const int len = cfg.piece_len == 0 ? gdn_cuda_default_piece_len() : cfg.piece_len;
  SF_CHECK(len == GdnCudaConfig::kUnsplit || (len >= C && len % C == 0), "GDN CUDA core: piece_len must be a ",
           "positive multiple of ", C, " tokens, 0 (STATEFLOW_GDN_PIECE_LEN) or GdnCudaConfig::kUnsplit, got ",
           cfg.piece_len);
  return len;
}

// The row sweeps' warps per 16 state rows: the config's, else 4 (the quarter sweeps), or 2 with
// the lever sweep_quarters off (the split-key row sweeps that were the default before them).
int key_split_of(const GdnCudaConfig& cfg) {
  return cfg.sweep_key_split ? cfg.sweep_key_split : lever_off("sweep_quarters") ? 2 : KQ;
}

// Who issues the copies of the quarter sweeps with one row group per block: 0 = the sweep warps,
// 1 = a copy warp (the config's sweep_copy_warp, else the lever sweep_copy_warp), 4 or 8 = a
// copy warp that multicasts the shared tiles to clusters of that many blocks (the config's
// sweep_multicast, else, with the untried lever sweep_multicast on, STATEFLOW_GDN_CLUSTER: 4 or
// 8, default 8).
bool copy_warp_on(const GdnCudaConfig& cfg) {
  return cfg.sweep_copy_warp ? cfg.sweep_copy_warp > 0 : !lever_off("sweep_copy_warp");
}
int copies_of(const GdnCudaConfig& cfg) {
  if (!copy_warp_on(cfg)) return 0;
  if (cfg.sweep_multicast) return cfg.sweep_multicast > 0 ? cfg.sweep_multicast : 1;
  if (lever_off("sweep_multicast")) return 1;
  const char* env = std::getenv("STATEFLOW_GDN_CLUSTER");
  if (env == nullptr || std::strcmp(env, "8") == 0) return 8;
  SF_CHECK(std::strcmp(env, "4") == 0, "STATEFLOW_GDN_CLUSTER must be 4 or 8 (blocks per cluster), got '", env, "'");
  return 4;
}


// The unsplit core's sweeps (GdnCudaConfig::Sweep), the default resolved through the environment.
int sweep_of(const GdnCudaConfig& cfg) {
  SF_CHECK(cfg.sweep >= GdnCudaConfig::kDefaultSweep && cfg.sweep <= GdnCudaConfig::kTileSweeps,
           "GDN CUDA core: sweep must be kDefaultSweep, kRowSweeps or kTileSweeps, got ", cfg.sweep);
  SF_CHECK(cfg.sweep_warps == 0 || cfg.sweep_warps == 2 || cfg.sweep_warps == 4 || cfg.sweep_warps == 8,
           "GDN CUDA core: sweep_warps must be 2, 4 or 8 (or 0 for automatic), got ", cfg.sweep_warps);
  SF_CHECK(cfg.sweep_key_split == 0 || cfg.sweep_key_split == 1 || cfg.sweep_key_split == 2 ||
               cfg.sweep_key_split == KQ,
           "GDN CUDA core: sweep_key_split must be 1, 2 or 4 (or 0 for automatic), got ", cfg.sweep_key_split);
  SF_CHECK(cfg.sweep_copy_warp >= -1 && cfg.sweep_copy_warp <= 1,
           "GDN CUDA core: sweep_copy_warp must be 1 (on), -1 (off) or 0 (the lever sweep_copy_warp), got ",
           cfg.sweep_copy_warp);
  SF_CHECK(cfg.sweep_multicast == -1 || cfg.sweep_multicast == 0 || cfg.sweep_multicast == 4 || cfg.sweep_multicast == 8,
           "GDN CUDA core: sweep_multicast must be 4 or 8 (blocks per cluster), -1 (off) or 0 (the lever ",
           "sweep_multicast), got ", cfg.sweep_multicast);
  SF_CHECK(cfg.sweep_multicast <= 0 || copy_warp_on(cfg), "GDN CUDA core: sweep_multicast = ", cfg.sweep_multicast,
           " needs the quarter sweeps' copy warp; set sweep_copy_warp to 1 (or 0), or sweep_multicast to -1");
  SF_CHECK(!(key_split_of(cfg) == KQ && cfg.sweep_warps == 2), "GDN CUDA core: the quarter sweeps (key split 4) ",
           "need 4 or 8 warps per block, got sweep_warps = 2; ask for 4 or 8, or for key split 1 or 2");
  return cfg.sweep == GdnCudaConfig::kDefaultSweep ? gdn_cuda_default_sweep() : cfg.sweep;
}

// Whether whole tiles are copied by lines (GdnCudaConfig::sweep_copy_lines, else the lever
// sweep_copy_lines); only the quarter sweeps' per-block copies with one row group a block do.
bool lines_of(const GdnCudaConfig& cfg) {
  SF_CHECK(cfg.sweep_copy_lines >= -1 && cfg.sweep_copy_lines <= 1,
           "GDN CUDA core: sweep_copy_lines must be 1 (on), -1 (off) or 0 (the lever sweep_copy_lines), got ",
           cfg.sweep_copy_lines);
  return cfg.sweep_copy_lines ? cfg.sweep_copy_lines > 0 : !lever_off("sweep_copy_lines");
}

// ST's copy stages (GdnCudaConfig::sweep_stages, else the lever sweep_deep: 4 unless it is off);
// 4 only for the quarter sweeps' per-block copies with one row group a block (others keep theirs).
int forward_stages_of(const GdnCudaConfig& cfg) {
  SF_CHECK(cfg.sweep_stages == 0 || cfg.sweep_stages == 3 || cfg.sweep_stages == 4,
           "GDN CUDA core: sweep_stages must be 3 or 4 (or 0 for the lever sweep_deep), got ", cfg.sweep_stages);
  SF_CHECK(cfg.sweep_stages != 4 || copies_of(cfg) <= 1, "GDN CUDA core: sweep_stages = 4 needs the quarter ",
           "sweeps' per-block copies (sweep_multicast -1), got sweep_multicast ", cfg.sweep_multicast);
  return cfg.sweep_stages ? cfg.sweep_stages : lever_off("sweep_deep") ? 3 : 4;
}

bool is_split(const GdnCudaConfig& cfg) { return piece_len_of(cfg) != GdnCudaConfig::kUnsplit; }

int sub_chunks_per_piece(const GdnDims& d, const GdnCudaConfig& cfg) {
  return is_split(cfg) ? piece_len_of(cfg) / C : int((d.len + C - 1) / C);
}

struct WsLayout {
  size_t G, W, U, Vn, Hs, Tm, dVn, dHs, Ap, Up, Sp, progress, total;
  WsLayout(const GdnDims& d, const GdnCudaConfig& cfg) {
    const size_t bh = size_t(d.batch) * d.heads, ns = size_t((d.len + C - 1) / C), tp = ns * C;
    size_t off = 0;
    auto take = [&](size_t bytes) {
      const size_t o = off;
      off += (bytes + 255) / 256 * 256;
      return o;
    };
    const size_t kept = cfg.sweep_buffer ? 0 : 1;  // a caller's sweep buffer holds G, W, Vn and Hs instead
    G = take(kept * bh * tp * 4);
    W = take(kept * bh * tp * DK * 2);
    U = take(bh * tp * DV * 2);
    Vn = take(kept * bh * tp * DV * 2);
    Hs = take(kept * bh * ns * DV * DK * 2);
    Tm = take(bh * ns * C * C * 2);
    dVn = take(bh * tp * DV * 2);
    dHs = take(bh * ns * DV * DK * 2);
    const size_t sp = size_t(sub_chunks_per_piece(d, cfg)), np = is_split(cfg) ? (ns + sp - 1) / sp : 0;
    Ap = take(bh * np * DK * DK * 4);
    Up = take(bh * np * DV * DK * 4);
    Sp = take(bh * np * DV * DK * 4);
    progress = take(2 * ns * sizeof(unsigned));  // room for segments of one sub-chunk
    total = off;
  }
};

// Where a caller's sweep buffer (GdnCudaConfig::sweep_buffer) holds each part, in bytes, each at a
// 256-byte boundary: G fp32 [Tp], W bf16 [Tp][dk], Vn bf16 [Tp][dv], Hs bf16 [NS][dv][dk].
struct KeptSweepLayout {
  size_t G = 0, W, Vn, Hs, total;
  explicit KeptSweepLayout(const GdnDims& d) {
    const size_t bh = size_t(d.batch) * d.heads, ns = size_t((d.len + C - 1) / C), tp = ns * C;
    auto rounded = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
    W = rounded(bh * tp * 4);
    Vn = W + rounded(bh * tp * DK * 2);
    Hs = Vn + rounded(bh * tp * DV * 2);
    total = Hs + rounded(bh * ns * DV * DK * 2);
  }
};

void check_dims(const GdnDims& d) {
  SF_CHECK(d.dk == DK && d.dv == DV, "GDN CUDA core supports dk = dv = 128 only (got dk = ", d.dk, ", dv = ", d.dv,
           "); use the CPU core for other head sizes");
  SF_CHECK(d.block == C, "GDN CUDA core: sub-chunk size (GdnDims::block) must be 64, got ", d.block);
  SF_CHECK(d.batch >= 1 && d.heads >= 1 && d.len >= 1, "GDN CUDA core: empty problem (batch = ", d.batch,
           ", heads = ", d.heads, ", len = ", d.len, ")");
  SF_CHECK(d.batch <= 65535 && d.heads <= 65535 && d.len < (int64_t(1) << 31),
           "GDN CUDA core: batch and heads must be <= 65535 and len < 2^31");
}

Args make_args(const GdnDims& d, const GdnCudaConfig& cfg, void* workspace) {
  SF_CHECK(workspace != nullptr,
           "GDN CUDA core: workspace is null; allocate gdn_cuda_workspace_bytes(dims, config) bytes");
  sweep_of(cfg);  // refuses a bad sweep setting before anything runs
  SF_CHECK(cfg.b4_slab == 0 || cfg.b4_slab == 16 || cfg.b4_slab == 32 || cfg.b4_slab == 64,
           "GDN CUDA core: b4_slab must be 16, 32 or 64 (or 0 for automatic), got ", cfg.b4_slab);
  SF_CHECK(cfg.tile_copies >= GdnCudaConfig::kDefaultCopies && cfg.tile_copies <= GdnCudaConfig::kCopyPlans,
           "GDN CUDA core: tile_copies must be kDefaultCopies, kCopyLoops or kCopyPlans, got ", cfg.tile_copies);
  SF_CHECK(cfg.pre >= GdnCudaConfig::kDefaultPre && cfg.pre <= GdnCudaConfig::kPreLateV,
           "GDN CUDA core: pre must be kDefaultPre, kPreScalar, kPreMma or kPreLateV, got ", cfg.pre);
  SF_CHECK(cfg.pre != GdnCudaConfig::kPreLateV || cfg.tile_copies != GdnCudaConfig::kCopyLoops,
           "GDN CUDA core: the Pre with V loaded late (pre = kPreLateV) copies tiles by plans; got tile_copies ",
           cfg.tile_copies, ". Ask for kPreMma with it");
  const WsLayout L(d, cfg);
  char* w = static_cast<char*>(workspace);
  Args a{};
  a.B = int(d.batch), a.T = int(d.len), a.H = int(d.heads), a.NS = int((d.len + C - 1) / C);
  a.SP = sub_chunks_per_piece(d, cfg), a.NP = (a.NS + a.SP - 1) / a.SP;
  a.scale = float(d.scale);
  a.G = reinterpret_cast<float*>(w + L.G);
  a.W = reinterpret_cast<bf16*>(w + L.W);
  a.U = reinterpret_cast<bf16*>(w + L.U);
  a.Vn = reinterpret_cast<bf16*>(w + L.Vn);
  a.Hs = reinterpret_cast<bf16*>(w + L.Hs);
  if (cfg.sweep_buffer) {
    const KeptSweepLayout K(d);
    char* kept = static_cast<char*>(cfg.sweep_buffer);
    a.G = reinterpret_cast<float*>(kept + K.G);
    a.W = reinterpret_cast<bf16*>(kept + K.W);
    a.Vn = reinterpret_cast<bf16*>(kept + K.Vn);
    a.Hs = reinterpret_cast<bf16*>(kept + K.Hs);
  }
  a.Tm = cfg.T_buffer ? cfg.T_buffer : reinterpret_cast<bf16*>(w + L.Tm);
  a.dVn = reinterpret_cast<bf16*>(w + L.dVn);
  a.dHs = reinterpret_cast<bf16*>(w + L.dHs);
  a.Ap = reinterpret_cast<float*>(w + L.Ap);
  a.Up = reinterpret_cast<float*>(w + L.Up);
  a.Sp = reinterpret_cast<float*>(w + L.Sp);
  return a;
}

// Every kernel here keeps its operands in shared memory (cp.async.cg loads bypass L1), so the
// carveout is asked to go to shared memory in full rather than left to the driver: B4
// (107 KiB) fits two blocks on an SM and Pre (75 KiB) three only with all of it (B1 from a kept
// T, 49 KiB: four).
template <class Kernel, class... More>
void launch(Kernel kernel, dim3 grid, int threads, int smem, cudaStream_t stream, const Args& a, More... more) {
  cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
             "raising the shared-memory limit");
  cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                  cudaSharedmemCarveoutMaxShared),
             "setting the shared-memory carveout");
  kernel<<<grid, threads, smem, stream>>>(a, more...);
  cuda_check(cudaGetLastError(), "kernel launch");
}

// Times consecutive stages with events when the caller asked for it (cfg.stage_ms).
class StageTimer {
 public:
  StageTimer(cudaStream_t s, float* out) : stream_(s), out_(out) {
    if (!out_) return;
    for (auto& e : ev_) cuda_check(cudaEventCreate(&e), "cudaEventCreate");
    cuda_check(cudaEventRecord(ev_[0], stream_), "cudaEventRecord");
  }
  void mark() {
    if (out_) cuda_check(cudaEventRecord(ev_[++n_], stream_), "cudaEventRecord");
  }
  ~StageTimer() {
    if (!out_) return;
    if (cudaEventSynchronize(ev_[n_]) == cudaSuccess)
      for (int i = 0; i < n_; ++i) cudaEventElapsedTime(&out_[i], ev_[i], ev_[i + 1]);
    for (auto& e : ev_) cudaEventDestroy(e);
  }

 private:
  cudaStream_t stream_;
  float* out_;
  cudaEvent_t ev_[5]{};
  int n_ = 0;
};

int pick_value_tile(const GdnDims& d, int requested) {
  if (requested != 0) {
    SF_CHECK(requested == 16 || requested == 32 || requested == 64,
             "GDN CUDA core: value_tile must be 16, 32 or 64 (or 0 for automatic), got ", requested);
    return requested;
  }
  int dev = 0, sms = 0;
  cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
  cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
  for (int bv : {64, 32})
    if (d.batch * d.heads * (DV / bv) >= sms) return bv;
  return 16;
}

int pick_piece_tile(int requested) {
  SF_CHECK(requested == 0 || requested == 32 || requested == 64 || requested == 128,
           "GDN CUDA core: piece_tile must be 32, 64 or 128 (or 0 for automatic), got ", requested);
  return requested ? requested : 64;
}

// launch() for a kernel compiled for clusters of CB blocks along x (the grid's x a multiple of CB).
template <int CB, class Kernel, class... More>
void launch_clusters(Kernel kernel, dim3 grid, int threads, int smem, cudaStream_t stream, const Args& a,
                     More... more) {
  cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
             "raising the shared-memory limit");
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = CB, cluster.val.clusterDim.y = 1, cluster.val.clusterDim.z = 1;
  config.attrs = &cluster;
  config.numAttrs = 1;
  cuda_check(cudaLaunchKernelEx(&config, kernel, a, more...), "cluster kernel launch");
}

// Row sweeps: ST (forward), or B3 with B1' beside it when the forward is recomputed. CB > 0:
// the quarter sweeps' copy warp multicasts to clusters of CB blocks (their barriers after the
// shared memory the sweep uses). kCount: B3's quarter sweeps count their segments (a.progress).
// FS: the forward's copy stages; LINES: the copy warp copies whole tiles by lines.
template <int RG, int KS, bool CW = false, int CB = 0, bool kCount = false, int FS = row_stages<RG, KS, false>(),
          bool LINES = false>
void row_sweeps(bool reverse, bool recompute, const Args& a, cudaStream_t stream) {
  if constexpr (KS == KQ && !kCount)
    if (reverse && a.progress) return row_sweeps<RG, KS, CW, CB, true, FS, LINES>(reverse, recompute, a, stream);
  constexpr int tiles = DV / (RG * RW), threads = row_threads<RG, KS, CW>();
  constexpr int bars = CB > 0 ? kMulticastBarrierBytes : 0;
  constexpr int fwd_smem = RowSmem<RG, KS, FS, false>::bytes + bars;
  static_assert(fwd_smem <= kMaxSmem, "the forward's copy stages fit in shared memory");
  constexpr int bwd_smem = RowSmem<RG, KS, row_stages<RG, KS, true>(), true>::bytes + bars;
  static_assert(CB == 0 || (CW && RG == 1 && tiles % (CB > 0 ? CB : 1) == 0), "multicast: the copy warp's one row group per block");
  const dim3 fwd_grid(tiles, a.H, a.B), bwd_grid(tiles * (recompute ? 2 : 1), a.H, a.B);
  const int bwd_bytes = recompute ? std::max(fwd_smem, bwd_smem) : bwd_smem;
  if constexpr (CB > 0) {
    if (!reverse) return launch_clusters<CB>(row_forward_kernel<RG, KS, CW, CB>, fwd_grid, threads, fwd_smem, stream, a);
    return launch_clusters<CB>(row_backward_kernel<RG, KS, CW, CB, kCount>, bwd_grid, threads, bwd_bytes, stream, a,
                               recompute);
  }
  if (!reverse) return launch(row_forward_kernel<RG, KS, CW, 0, FS, LINES>, fwd_grid, threads, fwd_smem, stream, a);
  launch(row_backward_kernel<RG, KS, CW, 0, kCount, LINES>, bwd_grid, threads, bwd_bytes, stream, a, recompute);
}

// warps: per block; key_split: warps per 16 state rows (key_split_of); warps 0 takes the
// defaults, the fastest measured at batch 1 x 16 heads (docs/benchmarks.md): one row group per
// block (128 blocks: 4 warps for the quarter sweeps, 2 for split keys), two for the backward
// that re-runs the forward sweep beside its own (its 2 x 64 blocks fit on the GPU at once;
// 2 x 128 do not). copies: the quarter sweeps' copy warp and its multicast (copies_of), with one row group
// per block only (nine warps would cap the eight sweep warps at 168 registers).
int row_sweep_warps(int warps, int key_split, bool reverse, bool recompute) {
  return warps ? warps : (key_split == 1 ? 2 : key_split) * (reverse && recompute && key_split > 1 ? 2 : 1);
}
// stages, lines: ST's copy stages (forward_stages_of) and the copy warp's whole-tile copies (lines_of).
void row_sweeps(int warps, int key_split, int copies, bool reverse, bool recompute, const Args& a,
                cudaStream_t stream, int stages = 3, bool lines = false) {
  warps = row_sweep_warps(warps, key_split, reverse, recompute);
  switch (key_split * 100 + warps) {
    case 102: return row_sweeps<2, 1>(reverse, recompute, a, stream);
    case 104: return row_sweeps<4, 1>(reverse, recompute, a, stream);
    case 108: return row_sweeps<8, 1>(reverse, recompute, a, stream);
    case 202: return row_sweeps<1, 2>(reverse, recompute, a, stream);
    case 204: return row_sweeps<2, 2>(reverse, recompute, a, stream);
    case 208: return row_sweeps<4, 2>(reverse, recompute, a, stream);
    case 404:
      switch (copies) {
        case 8: return row_sweeps<1, KQ, true, 8>(reverse, recompute, a, stream);
        case 4: return row_sweeps<1, KQ, true, 4>(reverse, recompute, a, stream);
        case 1:
          if (stages == 4 && !reverse)
            return lines ? row_sweeps<1, KQ, true, 0, false, 4, true>(reverse, recompute, a, stream)
                         : row_sweeps<1, KQ, true, 0, false, 4>(reverse, recompute, a, stream);
          if (lines) return row_sweeps<1, KQ, true, 0, false, 3, true>(reverse, recompute, a, stream);
          return row_sweeps<1, KQ, true>(reverse, recompute, a, stream);
        default:  // the sweep warps copy (sweep_copy_warp off)
          if (stages == 4 && !reverse)
            return lines ? row_sweeps<1, KQ, false, 0, false, 4, true>(reverse, recompute, a, stream)
                         : row_sweeps<1, KQ, false, 0, false, 4>(reverse, recompute, a, stream);
          if (lines) return row_sweeps<1, KQ, false, 0, false, 3, true>(reverse, recompute, a, stream);
          return row_sweeps<1, KQ>(reverse, recompute, a, stream);
      }
    case 408: return row_sweeps<2, KQ>(reverse, recompute, a, stream);
  }
}

// Split core, forward sweeps (steps 1-3 above); S_out (when a.S_out) comes from the fold.
template <int BV>
void split_forward_sweeps(const Args& a, cudaStream_t stream) {
  using Smem = FwdSweepSmem<BV, PIECE_STAGES>;
  launch(piece_maps_kernel<BV>, dim3(a.NP * (DV + DK) / BV, a.H, a.B), SWEEP_WARPS * 32, Smem::bytes, stream, a);
  launch(fold_kernel<false>, dim3(DV / FOLD_ROWS, a.H, a.B), 256, FoldSmem::bytes, stream, a);
  launch(piece_sweeps_kernel<BV>, dim3(a.NP * DV / BV, a.H, a.B), SWEEP_WARPS * 32, Smem::bytes, stream, a);
}

// Split core, reverse sweeps: V_p, the transposed fold (dS_in), the sweeps from the fold.
template <int BV>
void split_reverse_sweeps(const Args& a, cudaStream_t stream) {
  using Smem = BwdSweepSmem<BV, PIECE_STAGES>;
  const dim3 grid(a.NP * DV / BV, a.H, a.B);
  launch(piece_reverse_kernel<BV>, grid, SWEEP_WARPS * 32, Smem::bytes, stream, a, false);
  launch(fold_kernel<true>, dim3(DV / FOLD_ROWS, a.H, a.B), 256, FoldSmem::bytes, stream, a);
  launch(piece_reverse_kernel<BV>, grid, SWEEP_WARPS * 32, Smem::bytes, stream, a, true);
}

// The reverse sweep's shared memory holds at most 64-row tiles.
void split_sweeps(bool reverse, int tile, const Args& a, cudaStream_t stream) {
  if (reverse) return tile == 32 ? split_reverse_sweeps<32>(a, stream) : split_reverse_sweeps<64>(a, stream);
  switch (tile) {
    case 32: split_forward_sweeps<32>(a, stream); break;
    case 64: split_forward_sweeps<64>(a, stream); break;
    default: split_forward_sweeps<128>(a, stream);
  }
}

// Whether the kernels copy their tiles through per-thread plans (GdnCudaConfig::tile_copies).
bool tile_plans(const GdnCudaConfig& cfg) {
  return cfg.tile_copies == GdnCudaConfig::kDefaultCopies ? !lever_off("tile_copies")
                                                          : cfg.tile_copies == GdnCudaConfig::kCopyPlans;
}

// Which Pre runs (GdnCudaConfig::pre), the default resolved: on tensor cores unless the lever pre_mma
// is off, with V loaded late where the lever pre_late_v is on and tile copies are by plans.
int pre_of(const GdnCudaConfig& cfg) {
  if (cfg.pre != GdnCudaConfig::kDefaultPre) return cfg.pre;
  if (lever_off("pre_mma")) return GdnCudaConfig::kPreScalar;
  return tile_plans(cfg) && !lever_off("pre_late_v") ? GdnCudaConfig::kPreLateV : GdnCudaConfig::kPreMma;
}

// Pre on tensor cores (gdn_core_pre.cuh), or B1 from a kept T (from_T) by its kernel; kLateV: V
// loaded after the inversion (B1 from a kept T inverts nothing).
template <bool kPlans, bool kLateV = false>
void pre_mma(bool from_T, dim3 grid, const Args& a, cudaStream_t stream) {
  if (from_T) return launch(pre_mma_kernel<true, kPlans>, grid, 256, PreMmaSmem<true>::bytes, stream, a);
  using S = std::conditional_t<kLateV, PreLateVSmem, PreMmaSmem<false>>;
  launch(pre_mma_kernel<false, kPlans, kLateV>, grid, 256, S::bytes, stream, a);
}

// Pre, or B1 from a kept T (from_T), as pre_of says (kind), copying tiles through plans or not (late
// V: by plans).
void pre(bool from_T, bool plans, int kind, dim3 grid, const Args& a, cudaStream_t stream) {
  if (kind == GdnCudaConfig::kPreLateV) return pre_mma<true, true>(from_T, grid, a, stream);
  if (kind == GdnCudaConfig::kPreMma)
    return plans ? pre_mma<true>(from_T, grid, a, stream) : pre_mma<false>(from_T, grid, a, stream);
  if (from_T && plans) return launch(pre_kernel<true, true>, grid, 256, PreSmem<true>::bytes, stream, a);
  if (from_T) return launch(pre_kernel<true, false>, grid, 256, PreSmem<true>::bytes, stream, a);
  if (plans) return launch(pre_kernel<false, true>, grid, 256, PreSmem<false>::bytes, stream, a);
  launch(pre_kernel<false, false>, grid, 256, PreSmem<false>::bytes, stream, a);
}

// Whether B2 runs the lean kernel (GdnCudaConfig::b2; gdn_core_b2.cuh, which copies by plans):
// unless the config or the lever b2_lean says otherwise. Refuses a bad setting.
bool b2_lean_of(const GdnCudaConfig& cfg) {
  SF_CHECK(cfg.b2 >= GdnCudaConfig::kDefaultB2 && cfg.b2 <= GdnCudaConfig::kB2Lean,
           "GDN CUDA core: b2 must be kDefaultB2, kB2Plain or kB2Lean, got ", cfg.b2);
  const bool plans = tile_plans(cfg);
  SF_CHECK(cfg.b2 != GdnCudaConfig::kB2Lean || plans, "GDN CUDA core: the lean B2 (b2 = kB2Lean) copies tiles ",
           "by plans; got tile_copies ", cfg.tile_copies, ". Ask for kB2Plain with it");
  return cfg.b2 == GdnCudaConfig::kDefaultB2 ? plans && !lever_off("b2_lean") : cfg.b2 == GdnCudaConfig::kB2Lean;
}

// B2, by the lean kernel or not.
void b2(bool lean, bool plans, dim3 grid, const Args& a, cudaStream_t stream) {
  if (lean) return launch(dvloc_lean_kernel, grid, 256, DvlocLeanSmem::bytes, stream, a);
  if (plans) return launch(dvloc_kernel<true>, grid, 256, DvlocSmem::bytes, stream, a);
  launch(dvloc_kernel<false>, grid, 256, DvlocSmem::bytes, stream, a);
}

// Which B4 kernel runs (GdnCudaConfig::b4_kernel), the default resolved: the deep ring where the
// config allows it (mma.sync, 16- or 32-row steps, copies by plans) unless the lever b4_ring is
// off, with its early slabs unless the lever b4_ring_early is off, and with those its lean
// epilogues unless the lever b4_lean is off. Refuses a bad B4 setting (called before anything runs).
int b4_kernel_of(const GdnCudaConfig& cfg) {
  SF_CHECK(cfg.b4_mma >= GdnCudaConfig::kDefaultMma && cfg.b4_mma <= GdnCudaConfig::kWgmma,
           "GDN CUDA core: b4_mma must be kDefaultMma, kMmaSync or kWgmma, got ", cfg.b4_mma);
  const int mma = cfg.b4_mma == GdnCudaConfig::kDefaultMma ? gdn_cuda_default_b4_mma() : cfg.b4_mma;
  const bool plans = tile_plans(cfg);
  SF_CHECK(cfg.b4_kernel >= GdnCudaConfig::kDefaultB4Kernel && cfg.b4_kernel <= GdnCudaConfig::kB4Lean,
           "GDN CUDA core: b4_kernel must be kDefaultB4Kernel, kB4TwoSlots, kB4DeepRing, kB4EarlySlabs or kB4Lean, ",
           "got ", cfg.b4_kernel);
  const bool fits = mma == GdnCudaConfig::kMmaSync && cfg.b4_slab != 64 && plans;
  if (cfg.b4_kernel >= GdnCudaConfig::kB4DeepRing) {
    SF_CHECK(fits, "GDN CUDA core: the deep-ring B4 (b4_kernel = kB4DeepRing, kB4EarlySlabs or kB4Lean) runs ",
             "mma.sync products on 16- or 32-row steps with tile copies by plans; got b4_mma ", mma, ", b4_slab ",
             cfg.b4_slab, ", tile_copies ", cfg.tile_copies, ". Ask for kB4TwoSlots for the others");
    return cfg.b4_kernel;
  }
  if (cfg.b4_kernel == GdnCudaConfig::kB4TwoSlots || !fits || lever_off("b4_ring")) return GdnCudaConfig::kB4TwoSlots;
  if (lever_off("b4_ring_early")) return GdnCudaConfig::kB4DeepRing;
  return lever_off("b4_lean") ? GdnCudaConfig::kB4EarlySlabs : GdnCudaConfig::kB4Lean;
}

// The deep-ring B4 with 16 kStep rows a step: kB4DeepRing, kB4EarlySlabs or kB4Lean.
template <int kStep>
void b4_ring(int kernel, dim3 grid, const Args& a, cudaStream_t stream) {
  if (kernel == GdnCudaConfig::kB4Lean)
    return launch(b4_ring_kernel<kStep, true, true>, grid, 256, B4RingSmem<true>::bytes, stream, a);
  if (kernel == GdnCudaConfig::kB4EarlySlabs)
    return launch(b4_ring_kernel<kStep, true>, grid, 256, B4RingSmem<true>::bytes, stream, a);
  launch(b4_ring_kernel<kStep, false>, grid, 256, B4RingSmem<false>::bytes, stream, a);
}

// B4 with slabs of slab_rows value rows (GdnCudaConfig::b4_slab; 0 = 16), products P and
// tile copies through per-thread plans (kPlans) or not.
template <class P, bool kPlans>
void b4_with(int slab_rows, dim3 grid, const Args& a, cudaStream_t stream) {
  switch (slab_rows) {
    case 0:
    case 16: return launch(b4_kernel<16, P, kPlans>, grid, 256, B4Smem<16, P>::bytes, stream, a);
    case 32: return launch(b4_kernel<32, P, kPlans>, grid, 256, B4Smem<32, P>::bytes, stream, a);
    case 64: return launch(b4_kernel<64, P, kPlans>, grid, 256, B4Smem<64, P>::bytes, stream, a);
  }
}

// B4's kernel and products as the config asks (GdnCudaConfig::b4_kernel, b4_mma), defaults resolved here.
void b4(const GdnCudaConfig& cfg, dim3 grid, const Args& a, cudaStream_t stream) {
  SF_CHECK(cfg.b4_mma >= GdnCudaConfig::kDefaultMma && cfg.b4_mma <= GdnCudaConfig::kWgmma,
           "GDN CUDA core: b4_mma must be kDefaultMma, kMmaSync or kWgmma, got ", cfg.b4_mma);
  const int mma = cfg.b4_mma == GdnCudaConfig::kDefaultMma ? gdn_cuda_default_b4_mma() : cfg.b4_mma;
  const bool plans = tile_plans(cfg);
  if (const int kernel = b4_kernel_of(cfg); kernel != GdnCudaConfig::kB4TwoSlots)
    return cfg.b4_slab == 32 ? b4_ring<2>(kernel, grid, a, stream) : b4_ring<1>(kernel, grid, a, stream);
  if (mma == GdnCudaConfig::kMmaSync)
    return plans ? b4_with<MmaSyncProducts, true>(cfg.b4_slab, grid, a, stream)
                 : b4_with<MmaSyncProducts, false>(cfg.b4_slab, grid, a, stream);
  SF_CHECK(gdn_cuda_wgmma_available(), "GDN CUDA core: B4 on wgmma needs a compute capability 9.x GPU and a ",
           "build with sm_90a code (CMAKE_CUDA_ARCHITECTURES with 90a); use kMmaSync (STATEFLOW_GDN_B4=mma_sync)");
  plans ? b4_with<WgmmaProducts, true>(cfg.b4_slab, grid, a, stream)
        : b4_with<WgmmaProducts, false>(cfg.b4_slab, grid, a, stream);
}

// Sub-chunks per overlap segment (GdnCudaConfig::overlap_segment); refuses a bad overlap setting.
int overlap_segment_of(const GdnCudaConfig& cfg) {
  SF_CHECK(cfg.overlap >= -1 && cfg.overlap <= 1,
           "GDN CUDA core: overlap must be 1 (on), -1 (off) or 0 (the lever core_overlap), got ", cfg.overlap);
  SF_CHECK(cfg.overlap_segment >= 0, "GDN CUDA core: overlap_segment must be a number of sub-chunks >= 1 (or 0 for ",
           "STATEFLOW_GDN_OVERLAP_SEGMENT, default ", GdnCudaConfig::kDefaultOverlapSegment, "), got ",
           cfg.overlap_segment);
  SF_CHECK(cfg.overlap_streams >= 0 && cfg.overlap_streams <= kMaxOverlapStreams,
           "GDN CUDA core: overlap_streams must be 1 to ", kMaxOverlapStreams, " (or 0 for ",
           GdnCudaConfig::kDefaultOverlapStreams, "), got ", cfg.overlap_streams);
  return cfg.overlap_segment ? cfg.overlap_segment : gdn_cuda_default_overlap_segment();
}

// Whether the config asks for the overlap and its sweeps can count their segments (the unsplit
// quarter sweeps); refuses overlap = 1 with other sweeps (called before anything runs).
bool overlap_asked(const GdnCudaConfig& cfg) {
  overlap_segment_of(cfg);
  if (cfg.overlap < 0 || (cfg.overlap == 0 && lever_off("core_overlap"))) return false;
  const bool quarters = !is_split(cfg) && sweep_of(cfg) == GdnCudaConfig::kRowSweeps && key_split_of(cfg) == KQ;
  SF_CHECK(quarters || cfg.overlap == 0, "GDN CUDA core: overlap = 1 needs the unsplit quarter sweeps (row sweeps ",
           "with sweep_key_split 4 or 0, piece_len kUnsplit); set overlap to 0 or -1 for these sweeps");
  return quarters;
}

// Whether this backward overlaps B3 with B4: asked for, at least two segments, and a stream the
// overlap can run on now. The lever asks for it where it was measured faster on the H200, B3 alone
// (the forward sweep kept or saved: f+b at 32K -2.3 %, 128K -3.1 %); with the forward sweep re-run
// beside B3 (recompute, the layer's default) it was not (32K -0.4 %, 128K +2.0 %): there only
// overlap = 1 does (docs/benchmarks.md).
bool overlaps(int ns, const GdnCudaConfig& cfg, bool recompute, cudaStream_t stream) {
  if (!overlap_asked(cfg) || (recompute && cfg.overlap == 0)) return false;
  return ns >= 2 * overlap_segment_of(cfg) && gdn_overlap_can_run(stream);
}

// The backward re-runs the forward sweep beside B3 unless the forward's sweep was kept or saved.
bool recomputes_forward_sweep(const GdnCudaConfig& cfg) { return !cfg.saved_forward && !cfg.kept_sweep; }

// B3 (with the forward sweep beside it when recompute) on `stream` and beside it B4 on the
// sub-chunks the sweeps have finished, per the overlap plan.
void overlapped_b3_b4(const GdnCudaConfig& cfg, bool recompute, const Args& a, void* workspace, const WsLayout& L,
                      cudaStream_t stream) {
  Args swept = a;
  swept.seg = overlap_segment_of(cfg), swept.nseg = overlap_segments(a.NS, swept.seg);
  swept.progress = reinterpret_cast<unsigned*>(static_cast<char*>(workspace) + L.progress);
  // B4's block does not fit beside B3's 4-warp block (registers and shared memory): alone, B3 takes
  // two row groups a block (64 blocks) and leaves B4 the other SMs, unless the config picks.
  const int warps = row_sweep_warps(cfg.sweep_warps ? cfg.sweep_warps : recompute ? 0 : 2 * KQ, KQ, true, recompute);
  const unsigned blocks = unsigned(DV / (RW * (warps / KQ))) * a.H * a.B;  // per sweep
  SweepCounters c;
  c.counters = swept.progress, c.nseg = swept.nseg;
  c.forward_blocks = recompute ? blocks : 0, c.reverse_blocks = blocks;
  gdn_run_overlapped(
      stream, c, overlap_plan(a.NS, swept.seg, recompute),
      cfg.overlap_streams ? cfg.overlap_streams : GdnCudaConfig::kDefaultOverlapStreams,
      [&](cudaStream_t s) { row_sweeps(warps, KQ, copies_of(cfg), true, recompute, swept, s, 3, lines_of(cfg)); },
      [&](int first, int count, cudaStream_t s) {
        Args at = a;
        at.n0 = first;
        b4(cfg, dim3(count, a.H, a.B), at, s);
      });
}

}  // namespace

bool gdn_cuda_wgmma_available() {
#ifdef STATEFLOW_CUDA_SM90A
  int dev = 0, major = 0;
  cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
  cuda_check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "cudaDeviceGetAttribute");
  return major == 9;
#else
  return false;
#endif
}

int gdn_cuda_default_b4_mma() {
  const char* env = std::getenv("STATEFLOW_GDN_B4");
  if (env == nullptr || std::strcmp(env, "mma_sync") == 0) return GdnCudaConfig::kMmaSync;
  SF_CHECK(std::strcmp(env, "wgmma") == 0, "STATEFLOW_GDN_B4 must be mma_sync or wgmma, got '", env, "'");
  return GdnCudaConfig::kWgmma;
}

int gdn_cuda_default_piece_len() {
  // Unsplit unless asked: the layer calls the core once per pipeline chunk (2048 tokens by
  // default), where three sweeps' work over a chunk's few pieces costs more than one sweep at
  // every batch x heads measured (docs/benchmarks.md).
  const char* env = std::getenv("STATEFLOW_GDN_PIECE_LEN");
  if (env == nullptr || std::strcmp(env, "off") == 0) return GdnCudaConfig::kUnsplit;
  char* end = nullptr;
  const long len = std::strtol(env, &end, 10);
  SF_CHECK(*env != '\0' && *end == '\0' && len >= C && len <= 2048 && 2048 % len == 0,
           "STATEFLOW_GDN_PIECE_LEN must be off or a piece length in tokens that divides 2048 and is a multiple of ",
           C, " (64, 128, 256, 512, 1024 or 2048, so that chunk cuts at 2048-token multiples stay bitwise), got '",
           env, "'");
  return int(len);
}

int gdn_cuda_default_overlap_segment() {
  const char* env = std::getenv("STATEFLOW_GDN_OVERLAP_SEGMENT");
  if (env == nullptr) return GdnCudaConfig::kDefaultOverlapSegment;
  char* end = nullptr;
  const long seg = std::strtol(env, &end, 10);
  SF_CHECK(*env != '\0' && *end == '\0' && seg >= 1 && seg <= (1 << 20),
           "STATEFLOW_GDN_OVERLAP_SEGMENT must be a number of 64-token sub-chunks >= 1, got '", env, "'");
  return int(seg);
}

int gdn_cuda_default_sweep() {
  const char* env = std::getenv("STATEFLOW_GDN_SWEEP");
  if (env == nullptr || std::strcmp(env, "rows") == 0) return GdnCudaConfig::kRowSweeps;
  SF_CHECK(std::strcmp(env, "tiles") == 0, "STATEFLOW_GDN_SWEEP must be rows (the default) or tiles, got '", env, "'");
  return GdnCudaConfig::kTileSweeps;
}

int gdn_cuda_piece_len(const GdnDims& d, const GdnCudaConfig& cfg) {
  return is_split(cfg) ? sub_chunks_per_piece(d, cfg) * C : 0;
}

GdnStageCost gdn_cuda_stage_cost(const GdnDims& d, bool saved_forward) {
  check_dims(d);
  // Per sub-chunk of one (batch, head), from what the kernels above load and store.
  constexpr double tok = C * 2.0, vk = tok * DK, vv = tok * DV, st = DV * DK * 2.0, tc = C * C * 2.0, sc = C * 4.0;
  constexpr double kk = 2.0 * C * C * DK, sq = 2.0 * C * DK * DV, cc = 2.0 * C * C * C;  // C x C x DK, C x DK x DV, C^3
  const double pre_b = vk + vv + 2 * sc + sc + vk + vv + tc;  // k, v, g, beta -> G, W, U, T
  const double fwd_sweep_b = vk + vk + vv + sc + vv + st;   // W, K, U, G -> V_new, Hs
  const double rev_sweep_b = 3 * vk + 2 * vv + sc + vv + st;  // K, W, Q, dO, dV_new_local, G -> dV_new, dHs
  const double stage_b[7] = {pre_b,
                             fwd_sweep_b,
                             2 * vk + st + vv + sc + vv,  // q, k, Hs, V_new, G -> o
                             saved_forward ? 0 : pre_b,
                             2 * vk + vv + sc + vv,  // q, k, dO, G -> dV_new_local
                             rev_sweep_b + (saved_forward ? 0 : fwd_sweep_b),
                             // q, k, dO, V_new, dV_new, Hs, dHs, G, beta, v, T -> dq, dk, dv, dbeta, dg
                             2 * vk + 3 * vv + 2 * st + 2 * sc + vv + tc + 2 * vk + vv + 2 * sc};
  const double stage_f[7] = {3 * kk,           // K K^T, W, U
                             2 * sq,           // W S^T, the state update
                             2 * kk + sq,      // Q K^T, Q S^T, P V_new
                             saved_forward ? 0 : 3 * kk,
                             2 * kk,           // Q K^T, P^T dO
                             3 * sq + (saved_forward ? 0 : 2 * sq),  // dO^T Q, K dS^T, dV_new^T W
                             // dO S, V_new dSe, dV_new S; dO V_new^T, dPG K, dPG^T Q, dT (2), T^T dW,
                             // T^T dU, K K^T, X K, X^T K; M1, dA
                             3 * sq + 10 * kk + 2 * cc};
  const double subs = double(d.batch) * d.heads * double((d.len + C - 1) / C);
  GdnStageCost c{};
  for (int i = 0; i < 7; ++i) c.bytes[i] = subs * stage_b[i], c.flops[i] = subs * stage_f[i];
  return c;
}

size_t gdn_cuda_kept_T_bytes(const GdnDims& d) {
  check_dims(d);
  return size_t(d.batch) * d.heads * size_t((d.len + C - 1) / C) * C * C * sizeof(bf16);
}

size_t gdn_cuda_kept_sweep_bytes(const GdnDims& d) {
  check_dims(d);
  return KeptSweepLayout(d).total;
}

bool gdn_cuda_overlaps_backward(const GdnDims& d, const GdnCudaConfig& cfg, cudaStream_t stream) {
  check_dims(d);
  return overlaps(int((d.len + C - 1) / C), cfg, recomputes_forward_sweep(cfg), stream);
}

size_t gdn_cuda_workspace_bytes(const GdnDims& d, const GdnCudaConfig& cfg) {
  check_dims(d);
  return WsLayout(d, cfg).total;
}

void gdn_chunk_forward_cuda(const GdnDims& d, const __nv_bfloat16* q, const __nv_bfloat16* k,
                            const __nv_bfloat16* v, const float* beta, const float* g, const float* S_in,
                            __nv_bfloat16* o, float* S_out, void* workspace, cudaStream_t stream,
                            const GdnCudaConfig& cfg) {
  check_dims(d);
  Args a = make_args(d, cfg, workspace);
  a.q = q, a.k = k, a.v = v, a.beta = beta, a.g = g, a.S_in = S_in, a.o = o, a.S_out = S_out;
  overlap_asked(cfg);  // refuses a bad overlap setting (the backward's) before anything runs
  const int stages = forward_stages_of(cfg);  // and a bad sweep_stages
  b2_lean_of(cfg);     // and a bad B2 setting
  const dim3 subs(a.NS, a.H, a.B);
  StageTimer timer(stream, cfg.stage_ms);
  pre(false, tile_plans(cfg), pre_of(cfg), subs, a, stream);
  timer.mark();
  if (is_split(cfg)) split_sweeps(false, pick_piece_tile(cfg.piece_tile), a, stream);
  else if (sweep_of(cfg) == GdnCudaConfig::kRowSweeps)
    row_sweeps(cfg.sweep_warps, key_split_of(cfg), copies_of(cfg), false, false, a, stream, stages, lines_of(cfg));
  else switch (pick_value_tile(d, cfg.value_tile)) {
    case 16: launch(st_forward_kernel<16>, dim3(DV / 16, a.H, a.B), SWEEP_WARPS * 32, FwdSweepSmem<16, SWEEP_STAGES>::bytes, stream, a); break;
    case 32: launch(st_forward_kernel<32>, dim3(DV / 32, a.H, a.B), SWEEP_WARPS * 32, FwdSweepSmem<32, SWEEP_STAGES>::bytes, stream, a); break;
    default: launch(st_forward_kernel<64>, dim3(DV / 64, a.H, a.B), SWEEP_WARPS * 32, FwdSweepSmem<64, SWEEP_STAGES>::bytes, stream, a);
  }
  timer.mark();
  if (tile_plans(cfg)) launch(out_kernel<true>, subs, 256, OutSmem::bytes, stream, a);
  else launch(out_kernel<false>, subs, 256, OutSmem::bytes, stream, a);
  timer.mark();
}

void gdn_chunk_backward_cuda(const GdnDims& d, const __nv_bfloat16* q, const __nv_bfloat16* k,
                             const __nv_bfloat16* v, const float* beta, const float* g, const float* S_in,
                             const __nv_bfloat16* dO, const float* dS_out, __nv_bfloat16* dq, __nv_bfloat16* dk,
                             __nv_bfloat16* dv, float* dbeta, float* dg, float* dS_in, void* workspace,
                             cudaStream_t stream, const GdnCudaConfig& cfg) {
  check_dims(d);
  Args a = make_args(d, cfg, workspace);
  a.q = q, a.k = k, a.v = v, a.beta = beta, a.g = g, a.S_in = S_in, a.dO = dO, a.dS_out = dS_out;
  a.dq = dq, a.dk = dk, a.dv = dv, a.dbeta = dbeta, a.dg = dg, a.dS_in = dS_in;
  b4_kernel_of(cfg);  // refuses a bad B4 setting before anything runs
  overlap_asked(cfg);  // and a bad overlap setting
  const bool lean_b2 = b2_lean_of(cfg);
  const dim3 subs(a.NS, a.H, a.B);
  StageTimer timer(stream, cfg.stage_ms);
  const dim3 tiles(DV / BV_BWD, a.H, a.B);
  const bool sweep_kept = !recomputes_forward_sweep(cfg);  // G, W, V_new and Hs still where the forward put them
  // B1 forms G, W, U (and T unless kept); nothing is missing once T and the sweep are kept, unless the
  // split core re-runs its piece sweeps (they read U).
  const bool b1_needed = !cfg.saved_forward && !(cfg.kept_sweep && cfg.kept_T && !is_split(cfg));
  if (b1_needed) pre(cfg.kept_T, tile_plans(cfg), pre_of(cfg), subs, a, stream);
  timer.mark();
  b2(lean_b2, tile_plans(cfg), subs, a, stream);
  timer.mark();
  if (overlaps(a.NS, cfg, !sweep_kept, stream)) {
    overlapped_b3_b4(cfg, !sweep_kept, a, workspace, WsLayout(d, cfg), stream);
    timer.mark();
    timer.mark();
    return;
  }
  if (is_split(cfg)) {
    const int tile = pick_piece_tile(cfg.piece_tile);
    if (!cfg.saved_forward) {  // V_new and Hs for B4, and the transitions A_p (S_out not needed)
      Args fwd = a;
      fwd.S_out = nullptr;
      split_sweeps(false, tile, fwd, stream);
    }
    split_sweeps(true, tile, a, stream);
  } else if (sweep_of(cfg) == GdnCudaConfig::kRowSweeps)
    row_sweeps(cfg.sweep_warps, key_split_of(cfg), copies_of(cfg), true, !sweep_kept, a, stream, 3, lines_of(cfg));
  else if (sweep_kept)
    launch(st_reverse_kernel, tiles, SWEEP_WARPS * 32, BwdSweepSmem<BV_BWD, SWEEP_STAGES>::bytes, stream, a);
  else
    launch(st_backward_kernel, tiles, 256, FwdSweepBoth::bytes + BwdSweepBoth::bytes, stream, a);
  timer.mark();
  b4(cfg, subs, a, stream);
  timer.mark();
}

}  // namespace stateflow
