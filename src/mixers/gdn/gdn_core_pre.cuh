// Pre on tensor cores (GdnCudaConfig::pre = kPreMma, lever pre_mma): the inversion
// T = (I + A)^-1 of a sub-chunk's C x C unit lower-triangular matrix by mma.sync instead of fp32
// block products in shared memory, which kept the scalar Pre (pre_kernel) shared-memory-bound.
// Included by gdn_core.cu after pre_kernel, inside its anonymous namespace.
//
// A is cut into 4 x 4 blocks of 16 (i, k: block row, block column). The diagonal blocks are
// inverted as pre_kernel inverts them (fp32 forward substitution, a thread per column: the same
// bits). Column block j of T then follows from its own forward substitution, independent of the
// other column blocks: T_jj, then for i > j
//   T_ij = -T_ii sum_{k = j}^{i-1} A_ik T_kj,
// which one warp per column block runs in registers, transposed (Y_i = T_ij^T, the accumulator
// of one product is the A operand of the next; the blocks of A and T_ii are B operands read from
// shared memory). The products keep fp32 accuracy with bf16 operands by splitting each fp32
// operand x into hi = bf16(x) and lo = bf16(x - hi) (16 of its 24 significand bits) and adding
// lo * hi + hi * lo + hi * hi in fp32 (the lo * lo term, ~2^-16 of the product, is dropped).
// So T differs from the scalar Pre's in its off-diagonal blocks by about 2^-16 relative before
// both round it to bf16 (the float64 tests hold it to the same bands; docs/design.md).
//
// W = T diag(beta gamma) K and U = T diag(beta) V are formed from the bf16 T exactly as
// pre_kernel forms them (the same bf16 operands, added over the same 16-wide K steps in the same
// order), skipping the K steps where T is zero (above the diagonal); each warp owns two block
// rows of W or U (0 and 3, or 1 and 2: the same number of products) and reads each B fragment
// once for both. From a kept T (kFromT, B1) this is the whole kernel: bitwise pre_kernel's W, U.

using cuda::load_a;
using cuda::load_b2;
using cuda::mma_bf16;
using cuda::pack2;
using cuda::store_a;
using cuda::unpack2;

constexpr int PB = 16;               // side of the inversion's blocks; C = 4 PB
constexpr int ADS = PB * PB + 4;     // floats per fp32 diagonal block of A (rows read as float4)
using LowerTile = Tile<6 * PB, PB>;  // A's six blocks below the diagonal, stacked
using DiagTile = Tile<C, PB>;        // T's four diagonal blocks, stacked

// Rows of block (i, k), k < i, in a LowerTile.
__device__ constexpr int lower_rows(int i, int k) { return PB * (i * (i - 1) / 2 + k); }

template <bool kFromT>
struct PreMmaSmem {
  static constexpr int inv = kFromT ? 0 : 1;  // the inversion's buffers only when it runs
  static constexpr int k = 0;
  static constexpr int v = k + Tile<C, DK>::bytes;
  static constexpr int T = v + Tile<C, DV>::bytes;               // bf16(T), all C x C
  static constexpr int A_hi = T + Tile<C, C>::bytes;             // A below the diagonal, hi and lo
  static constexpr int A_lo = A_hi + inv * LowerTile::bytes;
  static constexpr int Td_hi = A_lo + inv * LowerTile::bytes;    // T's diagonal blocks, hi and lo
  static constexpr int Td_lo = Td_hi + inv * DiagTile::bytes;
  static constexpr int Ad = Td_lo + inv * DiagTile::bytes;       // A's diagonal blocks, fp32
  static constexpr int vec = Ad + inv * 4 * ADS * 4;
  static constexpr int stage = vec + 3 * C * 4;                  // each warp's 16 x 16 store tile
  static constexpr int bytes = stage + 8 * Tile<PB, PB>::bytes;
  // What shared memory allows (69 KiB; from a kept T 50 KiB), so registers are held to it too.
  static constexpr int blocks_per_sm = kFromT ? 4 : 3;
};

// Pre with V loaded late (GdnCudaConfig::kPreLateV, lever pre_late_v): V is read only by U's
// products at the end, so it goes into the inversion's buffers once the column solves are done
// (with the warps' staging tiles after it): 50 KiB, four blocks per SM instead of three (registers
// held to 64 to match), and each block's loads come in two parts, K at its start and V in its
// middle, instead of all at once. The warps that form U load V and wait for it alone.
struct PreLateVSmem {
  static constexpr int k = 0;
  static constexpr int T = k + Tile<C, DK>::bytes;
  static constexpr int vec = T + Tile<C, C>::bytes;
  static constexpr int A_hi = vec + 3 * C * 4;  // the inversion's buffers, as in PreMmaSmem
  static constexpr int A_lo = A_hi + LowerTile::bytes;
  static constexpr int Td_hi = A_lo + LowerTile::bytes;
  static constexpr int Td_lo = Td_hi + DiagTile::bytes;
  static constexpr int Ad = Td_lo + DiagTile::bytes;
  static constexpr int v = A_hi;  // once the column solves are done
  static constexpr int stage = v + Tile<C, DV>::bytes;
  static constexpr int bytes = std::max(Ad + 4 * ADS * 4, stage + 8 * Tile<PB, PB>::bytes);
  static constexpr int blocks_per_sm = 4;
};

// A 16 x 16 operand as the two bf16 halves of fp32 values, in A-fragment registers.
struct SplitA {
  uint32_t hi[4], lo[4];
};

// hi = bf16(x), lo = bf16(x - hi) for a pair of values packed the way pack2 packs them.
__device__ inline void split2(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  hi = pack2(x0, x1);
  const float2 h = unpack2(hi);
  lo = pack2(x0 - h.x, x1 - h.y);
}

// The A fragment of sign * f (a 16 x 16 accumulator), split (acc_to_a's register mapping).
__device__ inline SplitA split_acc(const Frag<16, 16>& f, float sign) {
  SplitA s;
#pragma unroll
  for (int h = 0; h < 4; ++h) {
    const float* x = f.x[0][h >> 1] + 2 * (h & 1);
    split2(sign * x[0], sign * x[1], s.hi[h], s.lo[h]);
  }
  return s;
}

// acc(16 x 16) += Y X^T, Y split in registers, X the 16 x 16 block at rows n0 of the tiles hi and lo
// (its two halves): small terms first.
template <class T>
__device__ void mma_split_bt(Frag<16, 16>& acc, const SplitA& y, T hi, T lo, int n0) {
  uint32_t bh[4], bl[4];
  load_b2<Lay::Col>(bh, hi, n0, 0);
  load_b2<Lay::Col>(bl, lo, n0, 0);
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    mma_bf16(acc.x[0][j], y.lo, bh[2 * j], bh[2 * j + 1]);
    mma_bf16(acc.x[0][j], y.hi, bl[2 * j], bl[2 * j + 1]);
    mma_bf16(acc.x[0][j], y.hi, bh[2 * j], bh[2 * j + 1]);
  }
}

// Column block J of T below the diagonal, by one warp: Y_i = T_iJ^T = -(sum_k Y_k A_ik^T) T_ii^T,
// Y_J = T_JJ^T; each Y_i rounded to bf16 into Ts (transposed back by stmatrix.trans).
template <int J>
__device__ void solve_column(Tile<C, C> Ts, LowerTile A_hi, LowerTile A_lo, DiagTile Td_hi, DiagTile Td_lo) {
  SplitA y[4];
  load_a<Lay::Col>(y[J].hi, Td_hi, 0, PB * J);
  load_a<Lay::Col>(y[J].lo, Td_lo, 0, PB * J);
#pragma unroll
  for (int i = J + 1; i < 4; ++i) {
    Frag<16, 16> z;
    z.fill(0.f);
#pragma unroll
    for (int k = J; k < i; ++k) mma_split_bt(z, y[k], A_hi, A_lo, lower_rows(i, k));
    const SplitA minus_z = split_acc(z, -1.f);
    Frag<16, 16> t;
    t.fill(0.f);
    mma_split_bt(t, minus_z, Td_hi, Td_lo, PB * i);
    y[i] = split_acc(t, 1.f);  // hi is bf16(T_iJ), what pre_kernel stores
    store_a<Lay::Col>(y[i].hi, Ts, PB * J, PB * i);
  }
}

// A's blocks (i, k0 .. k0 + NB - 1), the part on or below the diagonal, by one warp: pre_kernel's
// values (the same products and factors), blocks below the diagonal split into A_hi / A_lo, the
// diagonal block fp32 into Ad.
template <int NB>
__device__ void lower_blocks_of_A(Tile<C, DK> Ks, int i, int k0, const float* G, const float* beta, LowerTile A_hi,
                                  LowerTile A_lo, float* Ad) {
  Frag<16, PB * NB> kk;
  kk.fill(0.f);
  mma_acc<DK, Lay::Row, Lay::Col>(kk, Ks, PB * i, Ks, PB * k0);
  kk.each_pair([&](int r, int c, float& x0, float& x1) {
    r += PB * i, c += PB * k0;
    const float y0 = c < r ? beta[r] * x0 * expf(G[r] - G[c]) : 0.f;
    const float y1 = c + 1 < r ? beta[r] * x1 * expf(G[r] - G[c + 1]) : 0.f;
    const int kb = c / PB, rr = r % PB, cc = c % PB;
    if (kb == i) {
      *reinterpret_cast<float2*>(Ad + i * ADS + rr * PB + cc) = make_float2(y0, y1);
    } else if (kb < i) {
      uint32_t hi, lo;
      split2(y0, y1, hi, lo);
      *reinterpret_cast<uint32_t*>(A_hi.at(lower_rows(i, kb) + rr, cc)) = hi;
      *reinterpret_cast<uint32_t*>(A_lo.at(lower_rows(i, kb) + rr, cc)) = lo;
    }
  });
}

// A warp's 16 x 16 accumulator rounded to bf16 (as put2 rounds) to rows m0.., columns n0.. of out
// (row stride DK) through its staging tile: a 16-byte store per lane, whole 32-byte row pieces.
__device__ void store_block(const Frag<16, 16>& f, Tile<PB, PB> stage, bf16* out, int m0, int n0) {
  uint32_t r[4];
#pragma unroll
  for (int h = 0; h < 4; ++h) r[h] = pack2(f.x[0][h >> 1][2 * (h & 1)], f.x[0][h >> 1][2 * (h & 1) + 1]);
  store_a<Lay::Row>(r, stage, 0, 0);
  __syncwarp();
  const int l = threadIdx.x & 31;
  *reinterpret_cast<uint4*>(out + (m0 + l / 2) * DK + n0 + (l % 2) * 8) =
      *reinterpret_cast<const uint4*>(stage.at(l / 2, (l % 2) * 8));
  __syncwarp();  // the tile is free again
}

// The A fragments of Ts's block row I, K steps 0..I, scaled per column c as pre_kernel scales
// T into Tw and Tu: bf16(T[r][c] * beta[c] * gam[c]) (W), bf16(T[r][c] * beta[c]) (U).
template <int I, bool kW>
__device__ void scaled_row_frags(uint32_t (&f)[I + 1][4], Tile<C, C> Ts, const float* beta, const float* gam) {
  const int l = threadIdx.x & 31;
#pragma unroll
  for (int kb = 0; kb <= I; ++kb) {
    load_a<Lay::Row>(f[kb], Ts, PB * I, PB * kb);
#pragma unroll
    for (int h = 0; h < 4; ++h) {  // register h holds columns c, c + 1 (see store_a)
      const int c = PB * kb + (h >> 1) * 8 + 2 * (l & 3);
      const float2 x = unpack2(f[kb][h]);
      f[kb][h] = kW ? pack2(x.x * beta[c] * gam[c], x.y * beta[c + 1] * gam[c + 1])
                    : pack2(x.x * beta[c], x.y * beta[c + 1]);
    }
  }
}

// Block rows I0 < I1 of W (kW, X = K) or U (X = V), columns [n0, n0 + 64), to out (row stride
// 128): the products over K steps 0..I of each row, a B fragment read once for both rows; 16
// columns at a time, so that the A fragments stay in registers for all of them (stores staged
// through the warp's tile).
template <int I0, int I1, bool kW>
__device__ void triangular_rows(Tile<C, C> Ts, Tile<C, DK> X, const float* beta, const float* gam, int n0,
                                bf16* out, Tile<PB, PB> stage) {
  uint32_t a0[I0 + 1][4], a1[I1 + 1][4];
  scaled_row_frags<I0, kW>(a0, Ts, beta, gam);
  scaled_row_frags<I1, kW>(a1, Ts, beta, gam);
#pragma unroll 1
  for (int nq = n0; nq < n0 + 64; nq += 16) {
    Frag<16, 16> f0, f1;
    f0.fill(0.f), f1.fill(0.f);
#pragma unroll
    for (int kb = 0; kb <= I1; ++kb) {
      uint32_t b[4];
      load_b2<Lay::Row>(b, X, nq, PB * kb);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        if (kb <= I0) mma_bf16(f0.x[0][j], a0[kb], b[2 * j], b[2 * j + 1]);
        mma_bf16(f1.x[0][j], a1[kb], b[2 * j], b[2 * j + 1]);
      }
    }
    store_block(f0, stage, out, PB * I0, nq);
    store_block(f1, stage, out, PB * I1, nq);
  }
}

// Pre with the inversion on tensor cores (and B1 from a kept T, kFromT): one block per
// (sub-chunk, head, batch), 8 warps, the same outputs as pre_kernel (W, U bitwise from the same T).
// kLateV (not with kFromT): V loaded after the column solves (PreLateVSmem).
template <bool kFromT, bool kPlans, bool kLateV = false>
__global__ void __launch_bounds__(256, kLateV ? PreLateVSmem::blocks_per_sm : PreMmaSmem<kFromT>::blocks_per_sm)
    pre_mma_kernel(Args a) {
  static_assert(!(kLateV && kFromT), "from a kept T there is no inversion to load V after");
  using S = std::conditional_t<kLateV, PreLateVSmem, PreMmaSmem<kFromT>>;
  extern __shared__ __align__(128) char sm[];
  const int n = blockIdx.x, h = blockIdx.y, b = blockIdx.z, tid = threadIdx.x, warp = tid >> 5;
  const int t0 = n * C, nv = min(C, a.T - t0);
  const int64_t r0 = a.tok(b, t0, h), ws0 = a.ws_row(b, h, n);
  bf16* Tg = a.Tm + a.ws_sub(b, h, n) * C * C;
  auto Ks = tile_at<Tile<C, DK>>(sm, S::k);
  auto Vs = tile_at<Tile<C, DV>>(sm, S::v);
  auto Ts = tile_at<Tile<C, C>>(sm, S::T);
  float *G = reinterpret_cast<float*>(sm + S::vec), *gam = G + C, *beta = gam + C;

  load_pre_inputs<kPlans, !kLateV>(a, Ks, Vs, r0, ws0, nv, G, gam, beta, tid, [&] {
    if constexpr (kFromT) {
      const BlockCopy<Tile<C, C>, kPlans> copy_T(tid);
      copy_T(Ts, Tg, C);
    }
  });
  if constexpr (!kFromT) {
    auto A_hi = tile_at<LowerTile>(sm, S::A_hi), A_lo = tile_at<LowerTile>(sm, S::A_lo);
    auto Td_hi = tile_at<DiagTile>(sm, S::Td_hi), Td_lo = tile_at<DiagTile>(sm, S::Td_lo);
    float* Ad = reinterpret_cast<float*>(sm + S::Ad);
    // 1. A's ten blocks on or below the diagonal, pre_kernel's values: warps 0-1 block row 3 / 2,
    //    block columns 0-1; warps 2-3 blocks (3, 2) and (1, 0), then zero T above the diagonal;
    //    warps 4-7 the diagonal blocks (i, i), i = warp - 4, each then its T_ii (2.): nothing
    //    waits for the substitution but the column solves.
    if (warp < 2) {
      lower_blocks_of_A<2>(Ks, 3 - warp, 0, G, beta, A_hi, A_lo, Ad);
    } else if (warp < 4) {
      lower_blocks_of_A<1>(Ks, warp == 2 ? 3 : 1, warp == 2 ? 2 : 0, G, beta, A_hi, A_lo, Ad);
      for (int e = tid - 64; e < C * C / 8; e += 64) {
        const int r = e / 8, c = (e % 8) * 8;
        if (c >= PB * (r / PB + 1)) *reinterpret_cast<uint4*>(Ts.at(r, c)) = make_uint4(0, 0, 0, 0);
      }
    } else {
      const int i = warp - 4, j = tid & 31;
      lower_blocks_of_A<1>(Ks, i, i, G, beta, A_hi, A_lo, Ad);
      __syncwarp();
      // 2. T_ii by forward substitution as invert_unit_lower does it (a lane per column j): to
      //    Ts rounded, to Td_hi / Td_lo split.
      if (j < PB) {
        const float* Ai = Ad + i * ADS;
        float x[PB];
#pragma unroll
        for (int r = 0; r < PB; ++r) x[r] = r == j ? 1.f : 0.f;
#pragma unroll
        for (int r = 1; r < PB; ++r) {
          float s = 0.f;  // row r of the block is zero from column r on, so whole float4s are safe
#pragma unroll
          for (int c = 0; c < r; c += 4) {
            const float4 v = *reinterpret_cast<const float4*>(Ai + r * PB + c);
            s += v.x * x[c] + v.y * x[c + 1] + v.z * x[c + 2] + v.w * x[c + 3];
          }
          if (r > j) x[r] = -s;
        }
#pragma unroll
        for (int r = 0; r < PB; ++r) {
          const bf16 hi = __float2bfloat16_rn(x[r]);
          *Td_hi.at(PB * i + r, j) = hi;
          *Td_lo.at(PB * i + r, j) = __float2bfloat16_rn(x[r] - __bfloat162float(hi));
          *Ts.at(PB * i + r, PB * i + j) = hi;
        }
      }
    }
    __syncthreads();
    // 3. The blocks below the diagonal, a warp per column block.
    if (warp == 0) solve_column<0>(Ts, A_hi, A_lo, Td_hi, Td_lo);
    if (warp == 1) solve_column<1>(Ts, A_hi, A_lo, Td_hi, Td_lo);
    if (warp == 2) solve_column<2>(Ts, A_hi, A_lo, Td_hi, Td_lo);
    __syncthreads();
    if constexpr (kLateV) {  // the inversion's buffers are free: V, by the warps that form U (odd)
      if (warp & 1) {
        const cuda::TileCopy<128, Tile<C, DV>> copy_v((warp >> 1) * 32 + (tid & 31));
        copy_v(Vs, a.v + r0 * DV, int64_t(a.H) * DV, nv);
        cuda::cp_async_commit();
      }
    }
    for (int e = tid; e < C * C / 8; e += 256) {
      const int r = e / 8, c = (e % 8) * 8;
      *reinterpret_cast<uint4*>(Tg + r * C + c) = *reinterpret_cast<const uint4*>(Ts.at(r, c));
    }
  }
  // 4. W (even warps) and U (odd), each warp block rows {0, 3} (warps 0-3) or {1, 2} of one half
  //    of the columns.
  const int n0 = (warp >> 1 & 1) * (DK / 2);
  const bool outer = warp < 4;
  const auto stage = tile_at<Tile<PB, PB>>(sm, S::stage + warp * Tile<PB, PB>::bytes);
  if (warp & 1) {
    if constexpr (kLateV) {
      cuda::cp_async_wait_all();
      cuda::group_sync(1, 128);  // the four U warps' shares of V have landed
    }
    bf16* out = a.U + ws0 * DV;
    if (outer) triangular_rows<0, 3, false>(Ts, Vs, beta, gam, n0, out, stage);
    else triangular_rows<1, 2, false>(Ts, Vs, beta, gam, n0, out, stage);
  } else {
    bf16* out = a.W + ws0 * DK;
    if (outer) triangular_rows<0, 3, true>(Ts, Ks, beta, gam, n0, out, stage);
    else triangular_rows<1, 2, true>(Ts, Ks, beta, gam, n0, out, stage);
  }
}
