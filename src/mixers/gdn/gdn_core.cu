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
//   G   fp32 [Tp]           local cumsums                      (Pre)
//   W   bf16 [Tp][dk]       U bf16 [Tp][dv]                    (Pre)
//   Tm  bf16 [NS][C][C]     T = (I + A)^-1                     (Pre)
//   Vn  bf16 [Tp][dv]       V_new                              (ST)
//   Hs  bf16 [NS][dv][dk]   state entering each sub-chunk      (ST)
//   dVn bf16 [Tp][dv]       dV_new_local, then dV_new in place (B2, B3)
//   dHs bf16 [NS][dv][dk]   gradient of the state leaving each sub-chunk (B3)
#include "mixers/gdn/gdn_core_cuda.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/cuda/mma_tile.cuh"

namespace stateflow {
namespace {

using cuda::bf;
using cuda::bf16;
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
  float scale;
  const bf16 *q, *k, *v, *dO;
  const float *beta, *g, *S_in, *dS_out;
  bf16 *o, *dq, *dk, *dv;
  float *S_out, *dbeta, *dg, *dS_in;
  float* G;
  bf16 *W, *U, *Vn, *Hs, *Tm, *dVn, *dHs;

  // Row index of token (b, t, h) in the [B, T, H, *] tensors.
  __device__ int64_t tok(int b, int t, int h) const { return (int64_t(b) * T + t) * H + h; }
  // Workspace row of the first token of sub-chunk n of (b, h).
  __device__ int64_t ws_row(int b, int h, int n) const { return (int64_t(b) * H + h) * NS * C + int64_t(n) * C; }
  // Index of sub-chunk n of (b, h) among all sub-chunks.
  __device__ int64_t ws_sub(int b, int h, int n) const { return (int64_t(b) * H + h) * NS + n; }
};

// Stores the rows m0 + r < n_rows of a warp's accumulator tile as bf16 (row stride ld).
template <int WM, int WN>
__device__ void store_rows(Frag<WM, WN>& f, bf16* g, int64_t ld, int m0, int n0, int n_rows) {
  f.each_pair([&](int r, int c, float& x0, float& x1) {
    if (m0 + r < n_rows) put2(g + (m0 + r) * ld + n0 + c, x0, x1);
  });
}

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
// 8 warps. Writes G, T, W, U to the workspace.
// ---------------------------------------------------------------------------------------
struct PreSmem {
  static constexpr int k = 0;
  static constexpr int v = k + Tile<C, DK>::bytes;
  static constexpr int A = v + Tile<C, DV>::bytes;  // A, then T in place
  static constexpr int tmp = A + C * LDF * 4;
  static constexpr int Tw = tmp + 16 * C * 4;
  static constexpr int Tu = Tw + Tile<C, C>::bytes;
  static constexpr int vec = Tu + Tile<C, C>::bytes;
  static constexpr int bytes = vec + 3 * C * 4;
};

__global__ void __launch_bounds__(256) pre_kernel(Args a) {
  using S = PreSmem;
  extern __shared__ __align__(128) char sm[];
  const int n = blockIdx.x, h = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  const int wm = (tid >> 5) & 3, wn = tid >> 7;  // 4 x 2 warp grid
  const int t0 = n * C, nv = min(C, a.T - t0);
  const int64_t r0 = a.tok(b, t0, h), ws0 = a.ws_row(b, h, n);
  auto Ks = tile_at<Tile<C, DK>>(sm, S::k);
  auto Vs = tile_at<Tile<C, DV>>(sm, S::v);
  auto Tw = tile_at<Tile<C, C>>(sm, S::Tw), Tu = tile_at<Tile<C, C>>(sm, S::Tu);
  float* Af = reinterpret_cast<float*>(sm + S::A);
  float *G = reinterpret_cast<float*>(sm + S::vec), *gam = G + C, *beta = gam + C;

  cuda::load_tile_async<256>(Ks, a.k + r0 * DK, int64_t(a.H) * DK, nv, tid);
  cuda::load_tile_async<256>(Vs, a.v + r0 * DV, int64_t(a.H) * DV, nv, tid);
  cuda::cp_async_commit();
  load_decays(a, r0, nv, G, gam, beta, tid);
  if (tid < C) a.G[ws0 + tid] = G[tid];
  cuda::cp_async_wait_all();
  __syncthreads();
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
  for (int i = tid; i < C * C / 2; i += 256) {
    const int r = i / (C / 2), c = 2 * (i % (C / 2));
    const float x0 = Af[r * LDF + c], x1 = Af[r * LDF + c + 1];
    put2(Tw.at(r, c), x0 * beta[c] * gam[c], x1 * beta[c + 1] * gam[c + 1]);
    put2(Tu.at(r, c), x0 * beta[c], x1 * beta[c + 1]);
    put2(a.Tm + (a.ws_sub(b, h, n) * C + r) * C + c, x0, x1);
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
  cuda::load_tile_async<256>(Qs, a.q + r0 * DK, int64_t(a.H) * DK, nv, tid);
  cuda::load_tile_async<256>(Ks, a.k + r0 * DK, int64_t(a.H) * DK, nv, tid);
  cuda::load_tile_async<256>(dOs, a.dO + r0 * DV, int64_t(a.H) * DV, nv, tid);
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
  __syncthreads();
  Frag<16, DV / 2> d;
  d.fill(0.f);
  mma_acc<C, Lay::Col, Lay::Row>(d, Ps, wm * 16, dOs, wn * DV / 2);
  store_rows(d, a.dVn + ws0 * DV, DV, wm * 16, wn * DV / 2, C);
}

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

// Forward sweep (MATH.md ST): writes Vn and the bf16 snapshots Hs of the entering states;
// S_out when store_state. gt: thread index within the group; bar: its named barrier.
template <int BV, int STAGES, int NW>
__device__ void forward_sweep(const Args& a, int b, int h, int vt, char* sm, int gt, int bar, bool store_state) {
  using S = FwdSweepSmem<BV, STAGES>;
  constexpr int NT = NW * 32, WN = DK / NW;  // threads; state columns per warp
  constexpr int VN = BV * 4 / NW;            // columns of the C x BV products per warp
  const int warp = gt >> 5, m0 = (warp & 3) * 16, n0 = (warp >> 2) * VN;
  const int64_t bh = int64_t(b) * a.H + h;
  auto Wt = [&](int s) { return tile_at<Tile<C, DK>>(sm, S::W + s * Tile<C, DK>::bytes); };
  auto Kt = [&](int s) { return tile_at<Tile<C, DK>>(sm, S::K + s * Tile<C, DK>::bytes); };
  auto Ut = [&](int s) { return tile_at<Tile<C, BV>>(sm, S::U + s * Tile<C, BV>::bytes); };
  auto Gt = [&](int s) { return reinterpret_cast<float*>(sm + S::G + s * C * 4); };
  auto Ss = tile_at<Tile<BV, DK>>(sm, S::S);
  auto Vne = tile_at<Tile<C, BV>>(sm, S::Vne);

  Frag<BV, WN> st;  // rows v of the tile, columns warp * WN + c
  if (a.S_in) {
    const float* src = a.S_in + (bh * DV + vt * BV) * DK + warp * WN;
    st.each([&](int r, int c, float& x) { x = src[r * DK + c]; });
  } else {
    st.fill(0.f);
  }
  auto issue = [&](int n, int s) {
    const int t0 = n * C;
    const int64_t ws0 = a.ws_row(b, h, n);
    cuda::load_tile_async<NT>(Wt(s), a.W + ws0 * DK, DK, C, gt);
    cuda::load_tile_async<NT>(Kt(s), a.k + a.tok(b, t0, h) * DK, int64_t(a.H) * DK, min(C, a.T - t0), gt);
    cuda::load_tile_async<NT>(Ut(s), a.U + ws0 * DV + vt * BV, DV, C, gt);
    cuda::load_floats_async<NT>(Gt(s), a.G + ws0, C, gt);
  };
  for (int i = 0; i < STAGES - 1; ++i) {  // one commit group per sub-chunk, empty past the end
    if (i < a.NS) issue(i, i);
    cuda::cp_async_commit();
  }
  for (int n = 0; n < a.NS; ++n) {
    const int s = n % STAGES;
    cuda::cp_async_wait<STAGES - 2>();
    cuda::group_sync(bar, NT);
    if (n + STAGES - 1 < a.NS) issue(n + STAGES - 1, (n + STAGES - 1) % STAGES);
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
        const float v0 = bf(u[0]) - x0, v1 = bf(u[1]) - x1, e = expf(GL - G[r]);
        put2(a.Vn + (ws0 + r) * DV + vt * BV + c, v0, v1);
        put2(Vne.at(r, c), v0 * e, v1 * e);
      });
    }
    bf16* hs = a.Hs + (a.ws_sub(b, h, n) * DV + vt * BV) * DK;
    for (int i = gt; i < BV * DK / 8; i += NT) {
      const int r = i / (DK / 8), c = (i % (DK / 8)) * 8;
      *reinterpret_cast<uint4*>(hs + r * DK + c) = *reinterpret_cast<const uint4*>(Ss.at(r, c));
    }
    cuda::group_sync(bar, NT);
    const float gl = expf(GL);
    st.each([&](int, int, float& x) { x *= gl; });
    mma_acc<C, Lay::Col, Lay::Row>(st, Vne, 0, Kt(s), warp * WN);
  }
  if (store_state && a.S_out) {
    float* dst = a.S_out + (bh * DV + vt * BV) * DK + warp * WN;
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
// Writes dV_new over dV_new_local, the bf16 snapshots dHs of dSe, and dS_in.
template <int BV, int STAGES, int NW>
__device__ void backward_sweep(const Args& a, int b, int h, int vt, char* sm, int gt, int bar) {
  using S = BwdSweepSmem<BV, STAGES>;
  constexpr int NT = NW * 32, WN = DK / NW;
  constexpr int VN = BV * 4 / NW;
  const int warp = gt >> 5, m0 = (warp & 3) * 16, n0 = (warp >> 2) * VN;
  const int64_t bh = int64_t(b) * a.H + h;
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
  if (a.dS_out) {
    const float* src = a.dS_out + (bh * DV + vt * BV) * DK + warp * WN;
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
    cuda::load_tile_async<NT>(dOt(s), a.dO + r0 * DV + vt * BV, int64_t(a.H) * DV, nv, gt);
    cuda::load_tile_async<NT>(dVlt(s), a.dVn + ws0 * DV + vt * BV, DV, C, gt);
    cuda::load_floats_async<NT>(Gt(s), a.G + ws0, C, gt);
  };
  for (int i = 0; i < STAGES - 1; ++i) {  // step i works on sub-chunk NS - 1 - i
    if (i < a.NS) issue(a.NS - 1 - i, i);
    cuda::cp_async_commit();
  }
  for (int i = 0; i < a.NS; ++i) {
    const int n = a.NS - 1 - i, s = i % STAGES;
    cuda::cp_async_wait<STAGES - 2>();
    cuda::group_sync(bar, NT);
    if (i + STAGES - 1 < a.NS) issue(n - (STAGES - 1), (i + STAGES - 1) % STAGES);
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
        put2(a.dVn + (ws0 + r) * DV + vt * BV + c, d0, d1);
        put2(dVneg.at(r, c), -d0, -d1);
      });
    }
    bf16* dhs = a.dHs + (a.ws_sub(b, h, n) * DV + vt * BV) * DK;
    for (int j = gt; j < BV * DK / 8; j += NT) {
      const int r = j / (DK / 8), c = (j % (DK / 8)) * 8;
      *reinterpret_cast<uint4*>(dhs + r * DK + c) = *reinterpret_cast<const uint4*>(dSs.at(r, c));
    }
    cuda::group_sync(bar, NT);
    mma_acc<C, Lay::Col, Lay::Row>(ds, dVneg, 0, Wt(s), warp * WN);
  }
  float* dst = a.dS_in + (bh * DV + vt * BV) * DK + warp * WN;
  ds.each([&](int r, int c, float& x) { dst[r * DK + c] = x; });
}

constexpr int SWEEP_STAGES = 3;  // pipeline depth of a sweep that has its SM to itself

constexpr int SWEEP_WARPS = 8;   // warps of a sweep that has its SM to itself

template <int BV>
__global__ void __launch_bounds__(SWEEP_WARPS * 32) st_forward_kernel(Args a) {
  extern __shared__ __align__(128) char sm[];
  forward_sweep<BV, SWEEP_STAGES, SWEEP_WARPS>(a, blockIdx.z, blockIdx.y, blockIdx.x, sm, threadIdx.x, 1, true);
}

// B3 alone, when the forward's sub-chunk states and V_new are still in the workspace.
__global__ void __launch_bounds__(SWEEP_WARPS * 32) st_reverse_kernel(Args a) {
  extern __shared__ __align__(128) char sm[];
  backward_sweep<BV_BWD, SWEEP_STAGES, SWEEP_WARPS>(a, blockIdx.z, blockIdx.y, blockIdx.x, sm, threadIdx.x, 1);
}

// B1' + B3 when nothing was kept: warpgroup 0 recomputes the forward sweep (Hs, Vn for B4),
// warpgroup 1 runs the reverse sweep; they are independent and share only the SM.
using FwdSweepBoth = FwdSweepSmem<BV_BWD, 2>;
using BwdSweepBoth = BwdSweepSmem<BV_BWD, 2>;
__global__ void __launch_bounds__(256) st_backward_kernel(Args a) {
  extern __shared__ __align__(128) char sm[];
  if (threadIdx.x < 128)
    forward_sweep<BV_BWD, 2, 4>(a, blockIdx.z, blockIdx.y, blockIdx.x, sm, threadIdx.x, 1, false);
  else
    backward_sweep<BV_BWD, 2, 4>(a, blockIdx.z, blockIdx.y, blockIdx.x, sm + FwdSweepBoth::bytes, threadIdx.x - 128, 2);
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

  cuda::load_tile_async<256>(Qs, a.q + r0 * DK, int64_t(a.H) * DK, nv, tid);
  cuda::load_tile_async<256>(Ks, a.k + r0 * DK, int64_t(a.H) * DK, nv, tid);
  cuda::load_tile_async<256>(Hs, a.Hs + a.ws_sub(b, h, n) * DV * DK, DK, DV, tid);
  cuda::load_tile_async<256>(Vn, a.Vn + ws0 * DV, DV, C, tid);
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
// fixed order through shared memory.
// ---------------------------------------------------------------------------------------
struct B4Smem {
  static constexpr int tk = Tile<C, DK>::bytes, tv = Tile<C, DV>::bytes, ts = Tile<DV, DK>::bytes,
                       tc = Tile<C, C>::bytes;
  static constexpr int q = 0, k = q + tk, dO = k + tk, vn = dO + tv, dvn = vn + tv, dW = dvn + tv;
  static constexpr int S = dW + tk;      // phase 1: entering state
  static constexpr int v = S, T = S + tv;  // phase 2: v and T reuse S's space
  static constexpr int dSe = S + ts;     // phase 1: leaving-state gradient
  static constexpr int dT = dSe, M1 = dT + tc, X = M1 + tc;  // phase 2 reuse dSe's space
  static constexpr int Y = dSe + ts;     // fp32 C x LDF scratch for the dA ⊙ A sums
  static constexpr int dPG = Y + C * LDF * 4;
  static constexpr int vec = dPG + tc;
  enum { vG, vGam, vBeta, vQdq, vKdk = vQdq + 2, vM = vKdk + 2, vTkb = vM + 2, vTvb = vTkb + 2, vYr = vTvb + 2, vYc, vdG, vRed, nvec };
  static constexpr int bytes = vec + nvec * C * 4;
  static_assert(tv + tc <= ts && 3 * tc <= ts, "phase-2 tiles must fit in the phase-1 state tiles");
};

__global__ void __launch_bounds__(256) b4_kernel(Args a) {
  using S = B4Smem;
  constexpr int HK = DK / 2, HV = DV / 2;
  extern __shared__ __align__(128) char sm[];
  const int n = blockIdx.x, h = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  const int warp = tid >> 5, wm = warp & 3, wn = warp >> 2, m0 = wm * 16;
  const int t0 = n * C, nv = min(C, a.T - t0);
  const int64_t r0 = a.tok(b, t0, h), ws0 = a.ws_row(b, h, n), sub = a.ws_sub(b, h, n);
  auto Qs = tile_at<Tile<C, DK>>(sm, S::q), Ks = tile_at<Tile<C, DK>>(sm, S::k);
  auto dOs = tile_at<Tile<C, DV>>(sm, S::dO), Vns = tile_at<Tile<C, DV>>(sm, S::vn);
  auto dVns = tile_at<Tile<C, DV>>(sm, S::dvn), Vs = tile_at<Tile<C, DV>>(sm, S::v);
  auto dWs = tile_at<Tile<C, DK>>(sm, S::dW);
  auto Ss = tile_at<Tile<DV, DK>>(sm, S::S), dSes = tile_at<Tile<DV, DK>>(sm, S::dSe);
  auto Ts = tile_at<Tile<C, C>>(sm, S::T), dTs = tile_at<Tile<C, C>>(sm, S::dT);
  auto M1s = tile_at<Tile<C, C>>(sm, S::M1), Xs = tile_at<Tile<C, C>>(sm, S::X);
  auto dPGs = tile_at<Tile<C, C>>(sm, S::dPG);
  float* Y = reinterpret_cast<float*>(sm + S::Y);
  auto vec = [&](int i) { return reinterpret_cast<float*>(sm + S::vec) + i * C; };
  float *G = vec(S::vG), *gam = vec(S::vGam), *beta = vec(S::vBeta);

  const int64_t ldk = int64_t(a.H) * DK, ldv = int64_t(a.H) * DV;
  cuda::load_tile_async<256>(Qs, a.q + r0 * DK, ldk, nv, tid);
  cuda::load_tile_async<256>(Ks, a.k + r0 * DK, ldk, nv, tid);
  cuda::load_tile_async<256>(dOs, a.dO + r0 * DV, ldv, nv, tid);
  cuda::load_tile_async<256>(Vns, a.Vn + ws0 * DV, DV, C, tid);
  cuda::load_tile_async<256>(dVns, a.dVn + ws0 * DV, DV, C, tid);
  cuda::load_tile_async<256>(Ss, a.Hs + sub * DV * DK, DK, DV, tid);
  cuda::load_tile_async<256>(dSes, a.dHs + sub * DV * DK, DK, DV, tid);
  cuda::load_floats_async<256>(G, a.G + ws0, C, tid);
  cuda::cp_async_commit();
  if (tid < C) beta[tid] = tid < nv ? a.beta[r0 + int64_t(tid) * a.H] : 0.f;
  cuda::cp_async_wait_all();
  __syncthreads();
  if (tid < C) gam[tid] = expf(G[tid]);
  __syncthreads();
  const float s = a.scale, GL = G[C - 1];

  // dG from the Out terms (inter: dO_r . O1_r; intra: rowsum - colsum of dP ⊙ P) and from
  // the state write (-m_c) adds up to q_r . dq_r - k_r . dk_r with dq, dk as they stand
  // after the intra term, so it is read off the accumulators instead of C x C scratch.
  Frag<16, HK> dq, dk;
  // Out, inter-chunk term: dq = s gamma_r dO S.
  dq.fill(0.f);
  mma_acc<DV, Lay::Row, Lay::Row>(dq, dOs, m0, Ss, wn * HK);
  dq.each([&](int r, int, float& x) { x *= s * gam[m0 + r]; });
  // State write: dk_c = e_c dSe^T v_new_c; m_c = k_c . dk_c also feeds dG_L.
  dk.fill(0.f);
  mma_acc<DV, Lay::Row, Lay::Row>(dk, Vns, m0, dSes, wn * HK);
  dk.each([&](int r, int, float& x) { x *= expf(GL - G[m0 + r]); });
  row_dot(dk, Ks, m0, wn * HK, vec(S::vM + wn));
  {  // dW = -dV_new S
    Frag<16, HK> t;
    t.fill(0.f);
    mma_acc<DV, Lay::Row, Lay::Row>(t, dVns, m0, Ss, wn * HK);
    t.each_pair([&](int r, int c, float& x0, float& x1) { put2(dWs.at(m0 + r, wn * HK + c), -x0, -x1); });
  }
  {  // <dSe, S> for dG_L
    float acc = 0.f;
    for (int i = tid; i < DV * DK / 2; i += 256) {
      const int r = i / (DK / 2), c = 2 * (i % (DK / 2));
      const bf16 *x = dSes.at(r, c), *y = Ss.at(r, c);
      acc += bf(x[0]) * bf(y[0]) + bf(x[1]) * bf(y[1]);
    }
    acc = warp_sum(acc);
    if ((tid & 31) == 0) vec(S::vRed)[warp] = acc;
  }
  __syncthreads();
  // Phase-2 operands go where S and dSe were.
  cuda::load_tile_async<256>(Vs, a.v + r0 * DV, ldv, nv, tid);
  cuda::load_tile_async<256>(Ts, a.Tm + sub * C * C, C, C, tid);
  cuda::cp_async_commit();
  {  // Out, intra-chunk term: dPG = s (dO V_new^T) ⊙ Gam, causal incl. the diagonal
    Frag<16, 32> dp;
    dp.fill(0.f);
    mma_acc<DV, Lay::Row, Lay::Col>(dp, dOs, m0, Vns, wn * 32);
    dp.each([&](int r, int c, float& x) {
      r += m0, c += wn * 32;
      *dPGs.at(r, c) = __float2bfloat16(c <= r ? s * x * expf(G[r] - G[c]) : 0.f);
    });
  }
  __syncthreads();
  mma_acc<C, Lay::Row, Lay::Row>(dq, dPGs, m0, Ks, wn * HK);
  mma_acc<C, Lay::Col, Lay::Row>(dk, dPGs, m0, Qs, wn * HK);
  row_dot(dq, Qs, m0, wn * HK, vec(S::vQdq + wn));
  row_dot(dk, Ks, m0, wn * HK, vec(S::vKdk + wn));
  store_rows(dq, a.dq + r0 * DK, ldk, m0, wn * HK, nv);
  cuda::cp_async_wait_all();
  __syncthreads();
  {  // dT = dW Kb^T + dU Vb^T (strictly lower part is all that matters)
    Frag<16, 32> ta, tb;
    ta.fill(0.f);
    tb.fill(0.f);
    mma_acc<DK, Lay::Row, Lay::Col>(ta, dWs, m0, Ks, wn * 32);
    mma_acc<DV, Lay::Row, Lay::Col>(tb, dVns, m0, Vs, wn * 32);
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
    mma_acc<C, Lay::Col, Lay::Row>(t, Ts, m0, dWs, wn * HK);
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
    mma_acc<C, Lay::Col, Lay::Row>(t, Ts, m0, dVns, wn * HV);
    row_dot(t, Vs, m0, wn * HV, vec(S::vTvb + wn));
    t.each([&](int r, int, float& x) { x *= beta[m0 + r]; });
    store_rows(t, a.dv + r0 * DV, ldv, m0, wn * HV, nv);
  }
  __syncthreads();
  {  // dA = -T^T dT T^T, first M1 = T^T dT
    Frag<16, 32> m;
    m.fill(0.f);
    mma_acc<C, Lay::Col, Lay::Row>(m, Ts, m0, dTs, wn * 32);
    m.each_pair([&](int r, int c, float& x0, float& x1) { put2(M1s.at(m0 + r, wn * 32 + c), x0, x1); });
  }
  __syncthreads();
  {  // A = beta_r (K K^T) ⊙ Gam: Y = dA ⊙ KK ⊙ Gam, X = beta_r dA ⊙ Gam
    Frag<16, 32> da, kk;
    da.fill(0.f);
    kk.fill(0.f);
    mma_acc<C, Lay::Row, Lay::Col>(da, M1s, m0, Ts, wn * 32);
    mma_acc<DK, Lay::Row, Lay::Col>(kk, Ks, m0, Ks, wn * 32);
    int idx = 0;
    da.each([&](int r, int c, float& x) {
      const float kv = kk.x[0][idx / 4][idx % 4];
      ++idx;
      r += m0, c += wn * 32;
      float y = 0.f, xx = 0.f;
      if (c < r) {
        const float gm = expf(G[r] - G[c]);
        y = -x * kv * gm;
        xx = -beta[r] * x * gm;
      }
      Y[r * LDF + c] = y;
      *Xs.at(r, c) = __float2bfloat16(xx);
    });
  }
  __syncthreads();
  if (tid < C) {
    float rs = 0.f, cs = 0.f;
    for (int j = 0; j < C; ++j) rs += Y[tid * LDF + j], cs += beta[j] * Y[j * LDF + tid];
    vec(S::vYr)[tid] = rs;
    vec(S::vYc)[tid] = cs;
  }
  mma_acc<C, Lay::Row, Lay::Row>(dk, Xs, m0, Ks, wn * HK);
  mma_acc<C, Lay::Col, Lay::Row>(dk, Xs, m0, Ks, wn * HK);
  store_rows(dk, a.dk + r0 * DK, ldk, m0, wn * HK, nv);
  __syncthreads();
  if (tid < C) {  // per-token scalars: dbeta, and dG before the reverse cumsum
    const int r = tid;
    const float tkb = vec(S::vTkb)[r] + vec(S::vTkb + 1)[r], tvb = vec(S::vTvb)[r] + vec(S::vTvb + 1)[r];
    const float qdq = vec(S::vQdq)[r] + vec(S::vQdq + 1)[r], kdk = vec(S::vKdk)[r] + vec(S::vKdk + 1)[r];
    const float yr = vec(S::vYr)[r];
    float dG = qdq - kdk + beta[r] * gam[r] * tkb + beta[r] * yr - vec(S::vYc)[r];
    if (r == C - 1) {  // the sub-chunk's last row also carries the state-decay terms
      float ms = 0.f, ss = 0.f;
      for (int c = 0; c < C; ++c) ms += vec(S::vM)[c] + vec(S::vM + 1)[c];
      for (int w = 0; w < 8; ++w) ss += vec(S::vRed)[w];
      dG += gam[C - 1] * ss + ms;
    }
    vec(S::vdG)[r] = dG;
    if (r < nv) a.dbeta[r0 + int64_t(r) * a.H] = gam[r] * tkb + tvb + yr;
  }
  __syncthreads();
  if (tid < nv) {  // dg = reverse cumsum of dG within the sub-chunk
    float acc = 0.f;
    for (int r = C - 1; r >= tid; --r) acc += vec(S::vdG)[r];
    a.dg[r0 + int64_t(tid) * a.H] = acc;
  }
}

// ---------------------------------------------------------------------------------------
// Host side
// ---------------------------------------------------------------------------------------
void cuda_check(cudaError_t e, const char* what) {
  SF_CHECK(e == cudaSuccess, "GDN CUDA core: ", what, " failed: ", cudaGetErrorString(e));
}

struct WsLayout {
  size_t G, W, U, Vn, Hs, Tm, dVn, dHs, total;
  explicit WsLayout(const GdnDims& d) {
    const size_t bh = size_t(d.batch) * d.heads, ns = size_t((d.len + C - 1) / C), tp = ns * C;
    size_t off = 0;
    auto take = [&](size_t bytes) {
      const size_t o = off;
      off += (bytes + 255) / 256 * 256;
      return o;
    };
    G = take(bh * tp * 4);
    W = take(bh * tp * DK * 2);
    U = take(bh * tp * DV * 2);
    Vn = take(bh * tp * DV * 2);
    Hs = take(bh * ns * DV * DK * 2);
    Tm = take(bh * ns * C * C * 2);
    dVn = take(bh * tp * DV * 2);
    dHs = take(bh * ns * DV * DK * 2);
    total = off;
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

Args make_args(const GdnDims& d, void* workspace) {
  SF_CHECK(workspace != nullptr, "GDN CUDA core: workspace is null; allocate gdn_cuda_workspace_bytes(dims) bytes");
  const WsLayout L(d);
  char* w = static_cast<char*>(workspace);
  Args a{};
  a.B = int(d.batch), a.T = int(d.len), a.H = int(d.heads), a.NS = int((d.len + C - 1) / C);
  a.scale = float(d.scale);
  a.G = reinterpret_cast<float*>(w + L.G);
  a.W = reinterpret_cast<bf16*>(w + L.W);
  a.U = reinterpret_cast<bf16*>(w + L.U);
  a.Vn = reinterpret_cast<bf16*>(w + L.Vn);
  a.Hs = reinterpret_cast<bf16*>(w + L.Hs);
  a.Tm = reinterpret_cast<bf16*>(w + L.Tm);
  a.dVn = reinterpret_cast<bf16*>(w + L.dVn);
  a.dHs = reinterpret_cast<bf16*>(w + L.dHs);
  return a;
}

template <class Kernel>
void launch(Kernel kernel, dim3 grid, int threads, int smem, cudaStream_t stream, const Args& a) {
  cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
             "raising the shared-memory limit");
  kernel<<<grid, threads, smem, stream>>>(a);
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

}  // namespace

size_t gdn_cuda_workspace_bytes(const GdnDims& d) {
  check_dims(d);
  return WsLayout(d).total;
}

void gdn_chunk_forward_cuda(const GdnDims& d, const __nv_bfloat16* q, const __nv_bfloat16* k,
                            const __nv_bfloat16* v, const float* beta, const float* g, const float* S_in,
                            __nv_bfloat16* o, float* S_out, void* workspace, cudaStream_t stream,
                            const GdnCudaConfig& cfg) {
  check_dims(d);
  Args a = make_args(d, workspace);
  a.q = q, a.k = k, a.v = v, a.beta = beta, a.g = g, a.S_in = S_in, a.o = o, a.S_out = S_out;
  const dim3 subs(a.NS, a.H, a.B);
  StageTimer timer(stream, cfg.stage_ms);
  launch(pre_kernel, subs, 256, PreSmem::bytes, stream, a);
  timer.mark();
  switch (pick_value_tile(d, cfg.value_tile)) {
    case 16: launch(st_forward_kernel<16>, dim3(DV / 16, a.H, a.B), SWEEP_WARPS * 32, FwdSweepSmem<16, SWEEP_STAGES>::bytes, stream, a); break;
    case 32: launch(st_forward_kernel<32>, dim3(DV / 32, a.H, a.B), SWEEP_WARPS * 32, FwdSweepSmem<32, SWEEP_STAGES>::bytes, stream, a); break;
    default: launch(st_forward_kernel<64>, dim3(DV / 64, a.H, a.B), SWEEP_WARPS * 32, FwdSweepSmem<64, SWEEP_STAGES>::bytes, stream, a);
  }
  timer.mark();
  launch(out_kernel, subs, 256, OutSmem::bytes, stream, a);
  timer.mark();
}

void gdn_chunk_backward_cuda(const GdnDims& d, const __nv_bfloat16* q, const __nv_bfloat16* k,
                             const __nv_bfloat16* v, const float* beta, const float* g, const float* S_in,
                             const __nv_bfloat16* dO, const float* dS_out, __nv_bfloat16* dq, __nv_bfloat16* dk,
                             __nv_bfloat16* dv, float* dbeta, float* dg, float* dS_in, void* workspace,
                             cudaStream_t stream, const GdnCudaConfig& cfg) {
  check_dims(d);
  Args a = make_args(d, workspace);
  a.q = q, a.k = k, a.v = v, a.beta = beta, a.g = g, a.S_in = S_in, a.dO = dO, a.dS_out = dS_out;
  a.dq = dq, a.dk = dk, a.dv = dv, a.dbeta = dbeta, a.dg = dg, a.dS_in = dS_in;
  const dim3 subs(a.NS, a.H, a.B);
  StageTimer timer(stream, cfg.stage_ms);
  const dim3 tiles(DV / BV_BWD, a.H, a.B);
  if (!cfg.saved_forward) launch(pre_kernel, subs, 256, PreSmem::bytes, stream, a);
  timer.mark();
  launch(dvloc_kernel, subs, 256, DvlocSmem::bytes, stream, a);
  timer.mark();
  if (cfg.saved_forward)
    launch(st_reverse_kernel, tiles, SWEEP_WARPS * 32, BwdSweepSmem<BV_BWD, SWEEP_STAGES>::bytes, stream, a);
  else
    launch(st_backward_kernel, tiles, 256, FwdSweepBoth::bytes + BwdSweepBoth::bytes, stream, a);
  timer.mark();
  launch(b4_kernel, subs, 256, B4Smem::bytes, stream, a);
  timer.mark();
}

}  // namespace stateflow
