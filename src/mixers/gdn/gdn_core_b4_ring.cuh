// B4 with a deep ring (GdnCudaConfig::b4_kernel = kB4DeepRing or kB4EarlySlabs, levers b4_ring
// and b4_ring_early): the same gradients as b4_kernel, bitwise, from the same products and the
// same epilogue expressions, with its loads issued further ahead. Included by gdn_core.cu after
// b4_kernel, inside its anonymous namespace (it uses that file's Args, constants and helpers);
// mma.sync products and tile copies by plans.
//
// Why: b4_kernel's two-slot ring issues slab j + 1 only while slab j is used, so each of its 16
// slab steps waits for one load round trip (DRAM in the first pass, L2 in the second) behind a
// body of only 16 mma.sync per warp. Here:
//   - dV_new is not loaded at the start (nothing reads it before the second pass), so the first
//     pass has its space for four 16-row (S, dSe) slab pairs. A step uses b4_slab / 16 of them
//     (16 rows: one slab used, three in flight; 32 rows: two used, two in flight, half the
//     barriers), the first in flight issued with the other tiles;
//   - dV_new is issued as soon as the first pass ends (its latency under the Out terms), and the
//     second pass streams S alone through four S-only slots the same way; with the early slabs
//     (kEarly) its first slabs are issued then too, and v after the Out terms' product;
//   - the epilogues read their per-row and per-column factors once per lane (two rows, eight
//     columns) and store bf16 pairs; the exps stay per element where b4_kernel has them (same
//     inputs, same bits);
//   - the state-decay part of dG_L (a serial sum over 64 tokens) is formed by a thread of its
//     own beside the per-token scalars instead of after them by the last token's thread.
// Shared memory: 4 tiles of 64 rows + the ring (2 tiles' worth) + vectors = 108 KiB, two blocks
// per SM as before.
#pragma once

template <bool kEarly = false>
struct B4RingSmem {
  using TK = Tile<C, DK>;  // also the C x DV tiles (DV = DK)
  using TC = Tile<C, C>;
  using TS = Tile<16, DK>;
  static constexpr int kSlots = 4, kSlabs = DV / TS::rows;
  static constexpr int tk = TK::bytes, tc = TC::bytes, ts = TS::bytes;
  // Pass 1: q, k, dO, V_new and kSlots (S, dSe) slab pairs. After it the ring holds the second
  // pass's S-only slots from its start and dV_new in its second half, and dT once the second pass
  // is done; dW and M1 go where q was. dPG goes to the ring's start (after it is free of slabs, so
  // the second pass's first slabs wait for dPG's end), v and X where dO was, T where V_new was; or,
  // kEarly, dPG and then T where dO was and v and X where V_new was, which lets the second pass's
  // first slabs go as soon as the first pass ends, at the cost of a barrier between the last reads
  // of dO and V_new and dPG's writes.
  static constexpr int q = 0, k = q + tk, dO = k + tk, vn = dO + tk, ring = vn + tk;
  static constexpr int pair = 2 * ts;
  static constexpr int dT = ring, dvn = ring + kSlots * ts;
  static constexpr int dPG = kEarly ? dO : ring, T = kEarly ? dO : vn, v = kEarly ? vn : dO, X = v;
  static constexpr int dW = q, M1 = q;
  static constexpr int vec = ring + kSlots * pair;
  enum { vG, vGam, vBeta, vQdq, vKdk = vQdq + 2, vM = vKdk + 2, vTkb = vM + 2, vTvb = vTkb + 2, vYr = vTvb + 2,
         vYc = vYr + 2, vdG = vYc + 4, vRed, vLast, nvec };
  static constexpr int bytes = vec + nvec * C * 4;
  static_assert(dvn + tk <= vec && kSlots * ts <= dvn - ring && tc <= dvn - ring, "ring layout");
  static_assert(2 * (bytes + 1024) <= 228 * 1024, "two blocks per SM");
};

// The slabs in flight before stream_ring's first step (kSlots - kStep of them), one cp.async
// group per step; copies issued before go with the first, those after_first issues with the next
// group committed.
struct NoMoreCopies {
  __device__ void operator()() const {}
};
template <int kStep, class Issue, class AfterFirst = NoMoreCopies>
__device__ void issue_ring_ahead(Issue&& issue, AfterFirst after_first = {}) {
  constexpr int kAhead = B4RingSmem<>::kSlots - kStep;
#pragma unroll
  for (int j = 0; j < kAhead; j += kStep) {
#pragma unroll
    for (int i = 0; i < kStep; ++i) issue(j + i, j + i);
    cuda::cp_async_commit();
    if (j == 0) after_first();
  }
}

// Streams the kSlabs slabs through the kSlots slots, kStep slabs at a time (GdnCudaConfig::b4_slab
// = 16 kStep rows) and the kSlots - kStep after them in flight: issue(j, slot) starts slab j's
// copies, body(j, slot) uses it. kAhead: the first in flight are issued here (else the caller
// issued them with issue_ring_ahead). Copies issued before a step's commit go with it. One block
// barrier per step: it publishes the step's slabs and frees the slots the next copies go to (the
// previous step's, whose bodies are done).
template <int kStep, bool kIssueAhead = true, class Issue, class Body>
__device__ void stream_ring(Issue&& issue, Body&& body) {
  using S = B4RingSmem<>;
  constexpr int kAhead = S::kSlots - kStep;
  static_assert(kAhead >= kStep && kAhead % kStep == 0, "whole steps in flight");
  if constexpr (kIssueAhead) issue_ring_ahead<kStep>(issue);
  for (int j = 0; j < S::kSlabs; j += kStep) {
    cuda::cp_async_wait<kAhead / kStep - 1>();  // this step's slabs and everything committed before
    __syncthreads();
    if (j + kAhead < S::kSlabs)
#pragma unroll
      for (int i = 0; i < kStep; ++i) issue(j + kAhead + i, (j + kAhead + i) % S::kSlots);
    cuda::cp_async_commit();  // empty near the end: keeps one group per step
#pragma unroll
    for (int i = 0; i < kStep; ++i) body(j + i, (j + i) % S::kSlots);
  }
  __syncthreads();  // the ring is free again
}

// Lean epilogues (kLean: GdnCudaConfig::kB4Lean, lever b4_lean): the operations of the shared
// pieces (add_slab_dot8, cuda::row_dot) and of the masked epilogues below in the same order with
// the same roundings, on fewer instructions: bf16 halves widened by a shift or a mask, the row dots'
// tile elements read as ldmatrix fragments, the causal masks as selects and warps whose tile the
// mask empties skipping their exps; the products x0 y0 + x1 y1 spelled as the shared pieces compile
// them (pair_dot), so the bits stay the same.

// cuda::row_dot, lean: the tile's elements come as ldmatrix A fragments, which hold lane for lane the
// pairs the accumulator holds (register h of block kb: n-tile 2 kb + h / 2, row + 8 (h % 2)), four
// ldmatrix for a 16 x 64 fragment instead of 64 two-byte loads; each row's sum in the same order.
template <int WN, class T>
__device__ __forceinline__ void row_dot_lean(Frag<16, WN>& f, T t, int m0, int n0, float* part) {
  float s[2] = {0.f, 0.f};
#pragma unroll
  for (int kb = 0; kb < WN / 16; ++kb) {
    uint32_t w[4];
    cuda::load_a<Lay::Row>(w, t, m0, n0 + 16 * kb);
#pragma unroll
    for (int h = 0; h < 4; ++h) {
      const float* x = f.x[0][2 * kb + (h >> 1)] + 2 * (h & 1);
      s[h & 1] = __fadd_rn(s[h & 1], pair_dot(x[0], lo_bf16(w[h]), x[1], hi_bf16(w[h])));
    }
  }
  const int l = threadIdx.x & 31;
  s[0] = cuda::quad_sum(s[0]);
  s[1] = cuda::quad_sum(s[1]);
  if ((l & 3) == 0) {
    part[m0 + (l >> 2)] = s[0];
    part[m0 + (l >> 2) + 8] = s[1];
  }
}

template <int kStep, bool kEarly, bool kLean = false>
__global__ void __launch_bounds__(256, 2) b4_ring_kernel(Args a) {
  using S = B4RingSmem<kEarly>;
  using TK = typename S::TK;
  using TC = typename S::TC;
  using TS = typename S::TS;
  using P = MmaSyncProducts;
  constexpr int HK = DK / 2, HV = DV / 2, SR = TS::rows;
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
  auto Spair = [&](int slot) { return tile_at<TS>(sm, S::ring + slot * S::pair); };
  auto dSpair = [&](int slot) { return tile_at<TS>(sm, S::ring + slot * S::pair + S::ts); };
  auto Sonly = [&](int slot) { return tile_at<TS>(sm, S::ring + slot * S::ts); };
  auto vec = [&](int i) { return reinterpret_cast<float*>(sm + S::vec) + i * C; };
  float *G = vec(S::vG), *gam = vec(S::vGam), *beta = vec(S::vBeta);
  const bf16 *Hs = a.Hs + sub * DV * DK, *dHs = a.dHs + sub * DV * DK;
  const cuda::TileCopy<256, TS> copy_slab(tid);
  const cuda::TileCopy<256, TK> copy_rows(tid);
  const cuda::TileCopy<256, TC> copy_T(tid);
  // The two accumulator rows this lane holds in every 16-row fragment: m0 + lr and m0 + lr + 8.
  const int lr = lane >> 2, ra = m0 + lr, rb = ra + 8;

  const int64_t ldk = int64_t(a.H) * DK, ldv = int64_t(a.H) * DV;
  auto copy_q_k = [&] {
    copy_rows(Qs, a.q + r0 * DK, ldk, nv);
    copy_rows(Ks, a.k + r0 * DK, ldk, nv);
  };
  if constexpr (!kLean) copy_q_k();
  copy_rows(dOs, a.dO + r0 * DV, ldv, nv);
  copy_rows(Vns, a.Vn + ws0 * DV, DV);
  cuda::load_floats_async<256>(G, a.G + ws0, C, tid);
  auto issue_pair = [&](int j, int slot) {
    copy_slab(Spair(slot), Hs + j * SR * DK, DK);
    copy_slab(dSpair(slot), dHs + j * SR * DK, DK);
  };
  // beta is a plain load a thread stores only once it has arrived; lean, it goes after the first
  // slabs are issued, and q and k (read only after the Out terms) with the second slab pair, so the
  // first step waits for a smaller first group.
  auto load_beta = [&] {
    if (tid < C) beta[tid] = tid < nv ? a.beta[r0 + int64_t(tid) * a.H] : 0.f;
  };
  if constexpr (!kLean) load_beta();
  issue_ring_ahead<kStep>(issue_pair, [&] {
    if constexpr (kLean) copy_q_k();
  });
  if constexpr (kLean) load_beta();
  const float s = a.scale;
  auto dot_rows = [&](auto& f, auto t, int n0, float* part) {
    if constexpr (kLean) row_dot_lean(f, t, m0, n0, part);
    else row_dot(f, t, m0, n0, part);
  };

  // Pass 1: dq = dO S, dk = V_new dSe, and this thread's share of <dSe, S> (b4_kernel's order:
  // row tid / 16 of each slab, 8 columns from (tid % 16) * 8).
  Frag<16, HK> dq, dk;
  dq.fill(0.f);
  dk.fill(0.f);
  float sds = 0.f;
  stream_ring<kStep, false>(issue_pair,
              [&](int j, int slot) {
                P::issue<SR, Lay::Row, Lay::Row>(dq, columns_from(dOs, j * SR), m0, Spair(slot), wn * HK);
                P::issue<SR, Lay::Row, Lay::Row>(dk, columns_from(Vns, j * SR), m0, dSpair(slot), wn * HK);
                add_slab_dot8<kLean>(sds, Spair(slot), dSpair(slot), tid / (DK / 8), (tid % (DK / 8)) * 8);
              });
  // dV_new's half of the ring is free now; it loads under the Out terms (kEarly: the second pass's
  // first slabs too).
  copy_rows(dVns, a.dVn + ws0 * DV, DV);
  cuda::cp_async_commit();
  auto issue_S = [&](int j, int slot) { copy_slab(Sonly(slot), Hs + j * SR * DK, DK); };
  if constexpr (kEarly) issue_ring_ahead<kStep>(issue_S);
  if (tid < C) gam[tid] = expf(G[tid]);
  {
    const float acc = warp_sum(sds);
    if (lane == 0) vec(S::vRed)[warp] = acc;
  }
  __syncthreads();
  {  // Out, intra-chunk term: dPG = s (dO V_new^T) ⊙ Gam, causal incl. the diagonal
    const float GL = G[C - 1], Ga = G[ra], Gb = G[rb];
    Frag<16, 32> dp;
    dp.fill(0.f);
    P::issue<DV, Lay::Row, Lay::Col>(dp, dOs, m0, Vns, wn * 32);
    const float qa = s * gam[ra], qb = s * gam[rb];
    const float ea = expf(GL - Ga), eb = expf(GL - Gb);
    dq.each([&](int r, int, float& x) { x *= r < 8 ? qa : qb; });
    dk.each([&](int r, int, float& x) { x *= r < 8 ? ea : eb; });
    dot_rows(dk, Ks, wn * HK, vec(S::vM + wn));  // m_c = k_c . dk_c also feeds dG_L
    P::wait();
    if constexpr (kEarly) {  // dO and V_new are read: dPG goes where dO was, v where V_new was
      __syncthreads();
      copy_rows(Vs, a.v + r0 * DV, ldv, nv);
    }
    dp.each_pair([&](int r, int c, float& x0, float& x1) {
      const int rr = m0 + r, cc = wn * 32 + c;
      const float Gr = r < 8 ? Ga : Gb;
      const float2 Gc = *reinterpret_cast<const float2*>(G + cc);
      if constexpr (kLean) {  // the warp's tile is all above the diagonal unless wn * 32 <= m0 + 15
        float v0 = 0.f, v1 = 0.f;
        if (wn * 32 <= m0 + 15) {
          const float e0 = s * x0 * expf(Gr - Gc.x), e1 = s * x1 * expf(Gr - Gc.y);
          v0 = cc <= rr ? e0 : 0.f, v1 = cc + 1 <= rr ? e1 : 0.f;
        }
        put2(dPGs.at(rr, cc), v0, v1);
      } else {
        put2(dPGs.at(rr, cc), cc <= rr ? s * x0 * expf(Gr - Gc.x) : 0.f, cc + 1 <= rr ? s * x1 * expf(Gr - Gc.y) : 0.f);
      }
    });
  }
  __syncthreads();
  P::issue<C, Lay::Row, Lay::Row>(dq, dPGs, m0, Ks, wn * HK);
  P::acc<C, Lay::Col, Lay::Row>(dk, dPGs, m0, Qs, wn * HK);
  dot_rows(dq, Qs, wn * HK, vec(S::vQdq + wn));
  dot_rows(dk, Ks, wn * HK, vec(S::vKdk + wn));
  store_rows(dq, a.dq + r0 * DK, ldk, m0, wn * HK, nv);
  __syncthreads();  // q, dO, V_new and dPG are free: phase 2's operands go there
  if constexpr (!kEarly) copy_rows(Vs, a.v + r0 * DV, ldv, nv);
  copy_T(Ts, a.Tm + sub * C * C, C);
  {  // Pass 2: dW = -dV_new S, to where q was
    Frag<16, HK> t;
    t.fill(0.f);
    stream_ring<kStep, !kEarly>(issue_S, [&](int j, int slot) {
      P::acc<SR, Lay::Row, Lay::Row>(t, columns_from(dVns, j * SR), m0, Sonly(slot), wn * HK);
    });
    t.each_pair([&](int r, int c, float& x0, float& x1) { put2(dWs.at(m0 + r, wn * HK + c), -x0, -x1); });
  }
  __syncthreads();
  // The WY terms read their factors per lane: this lane's two rows, and its eight columns of a
  // 32-wide fragment (c = c0 + 8 j + {0, 1}).
  const int c0 = wn * 32 + 2 * (lane & 3);
  {  // dT = dW Kb^T + dU Vb^T (strictly lower part is all that matters)
    Frag<16, 32> ta, tb;
    ta.fill(0.f);
    tb.fill(0.f);
    P::issue<DK, Lay::Row, Lay::Col>(ta, dWs, m0, Ks, wn * 32);
    P::acc<DV, Lay::Row, Lay::Col>(tb, dVns, m0, Vs, wn * 32);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int c = c0 + 8 * j;
      const float2 bc = *reinterpret_cast<const float2*>(beta + c), gc = *reinterpret_cast<const float2*>(gam + c);
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int r = hr ? rb : ra;
        const float* x = ta.x[0][j] + 2 * hr;
        const float* y = tb.x[0][j] + 2 * hr;
        put2(dTs.at(r, c), c < r ? bc.x * (gc.x * x[0] + y[0]) : 0.f, c + 1 < r ? bc.y * (gc.y * x[1] + y[1]) : 0.f);
      }
    }
  }
  {  // dKb = T^T dW
    Frag<16, HK> t;
    t.fill(0.f);
    P::acc<C, Lay::Col, Lay::Row>(t, Ts, m0, dWs, wn * HK);
    dot_rows(t, Ks, wn * HK, vec(S::vTkb + wn));
    const float ga = beta[ra] * gam[ra], gb = beta[rb] * gam[rb];
    int idx = 0;
    dk.each([&](int r, int, float& x) {
      x += (r < 8 ? ga : gb) * t.x[0][idx / 4][idx % 4];
      ++idx;
    });
  }
  {  // dVb = T^T dU, dv = beta dVb
    Frag<16, HV> t;
    t.fill(0.f);
    P::acc<C, Lay::Col, Lay::Row>(t, Ts, m0, dVns, wn * HV);
    dot_rows(t, Vs, wn * HV, vec(S::vTvb + wn));
    const float ba = beta[ra], bb = beta[rb];
    t.each([&](int r, int, float& x) { x *= r < 8 ? ba : bb; });
    store_rows(t, a.dv + r0 * DV, ldv, m0, wn * HV, nv);
  }
  __syncthreads();
  {  // dA = -T^T dT T^T, first M1 = T^T dT
    Frag<16, 32> m;
    m.fill(0.f);
    P::acc<C, Lay::Col, Lay::Row>(m, Ts, m0, dTs, wn * 32);
    m.each_pair([&](int r, int c, float& x0, float& x1) { put2(M1s.at(m0 + r, wn * 32 + c), x0, x1); });
  }
  __syncthreads();
  {  // A = beta_r (K K^T) ⊙ Gam: Y = dA ⊙ KK ⊙ Gam (row sums, beta-weighted column sums),
     // X = beta_r dA ⊙ Gam
    Frag<16, 32> da, kk;
    da.fill(0.f);
    kk.fill(0.f);
    P::issue<C, Lay::Row, Lay::Col>(da, M1s, m0, Ts, wn * 32);
    P::acc<DK, Lay::Row, Lay::Col>(kk, Ks, m0, Ks, wn * 32);
    const float Ga = G[ra], Gb = G[rb], ba = beta[ra], bb = beta[rb];
    float rs[2] = {0.f, 0.f}, cs[4][2] = {};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int c = c0 + 8 * j;
      const float2 Gc = *reinterpret_cast<const float2*>(G + c);
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int r = hr ? rb : ra;
        const float Gr = hr ? Gb : Ga, br = hr ? bb : ba;
        float xx[2];
#pragma unroll
        for (int p = 0; p < 2; ++p) {
          const int e = 2 * hr + p;
          const float x = da.x[0][j][e];
          float y = 0.f;
          xx[p] = 0.f;
          if constexpr (kLean) {  // a warp's tile has an element below the diagonal iff wn * 32 <= m0 + 14
            if (wn * 32 <= m0 + 14) {
              const float gm = expf(Gr - (p ? Gc.y : Gc.x));
              const float yy = -x * kk.x[0][j][e] * gm, xv = -br * x * gm;
              y = c + p < r ? yy : 0.f;
              xx[p] = c + p < r ? xv : 0.f;
            }
          } else if (c + p < r) {
            const float gm = expf(Gr - (p ? Gc.y : Gc.x));
            y = -x * kk.x[0][j][e] * gm;
            xx[p] = -br * x * gm;
          }
          rs[hr] += y;
          cs[j][p] += br * y;
        }
        put2(Xs.at(r, c), xx[0], xx[1]);
      }
    }
    store_y_sums(rs, cs, lane, m0, wn, vec(S::vYr + wn), vec(S::vYc + wm));
  }
  __syncthreads();
  P::issue<C, Lay::Row, Lay::Row>(dk, Xs, m0, Ks, wn * HK);
  P::acc<C, Lay::Col, Lay::Row>(dk, Xs, m0, Ks, wn * HK);
  store_rows(dk, a.dk + r0 * DK, ldk, m0, wn * HK, nv);
  if (tid < C) {  // per-token scalars: dbeta, and dG before the reverse cumsum
    const int r = tid;
    const float2 dbeta_dG = token_dbeta_dG<S>(vec, beta, gam, r);
    vec(S::vdG)[r] = dbeta_dG.y;
    if (r < nv) a.dbeta[r0 + int64_t(r) * a.H] = dbeta_dG.x;
  } else if (tid == C) {  // beside them, the state-decay terms the last row also carries (a serial sum)
    float ms = 0.f, ss = 0.f;
    for (int c = 0; c < C; ++c) ms += vec(S::vM)[c] + vec(S::vM + 1)[c];
    for (int w = 0; w < 8; ++w) ss += vec(S::vRed)[w];
    vec(S::vLast)[0] = gam[C - 1] * ss + ms;
  }
  __syncthreads();
  if (tid < nv) {  // dg = reverse cumsum of dG within the sub-chunk
    float acc = 0.f;
    acc += vec(S::vdG)[C - 1] + vec(S::vLast)[0];
    for (int r = C - 2; r >= tid; --r) acc += vec(S::vdG)[r];
    a.dg[r0 + int64_t(tid) * a.H] = acc;
  }
}
