// Quarter sweeps (GdnCudaConfig::sweep_key_split = 4): row sweeps whose 16 state rows are held by
// four warps, a quarter of the key columns (32) each, so that a (head, 16 rows) chain has a warp
// on every scheduler of its SM instead of one or two. Included by gdn_core.cu after the row
// sweeps' helpers (RowSmem, RowWarp, store_state_rows, ...), inside its anonymous namespace.
//
// A step's first product (forward S W^T, reverse K dSe^T) leaves each warp a 16 x 64 partial sum
// over its 32 keys. Instead of every warp adding all four partials (a 64-token all-reduce), each
// warp adds them for 16 tokens only, always in quarter order 0, 1, 2, 3 (so the sum is the same in
// every warp, run and chunking), finishes those 16 tokens of V_new (or dV_new), stores them, and
// hands them to the others as one bf16 A fragment in shared memory; after a barrier of the four,
// each reads the 16 x 64 operand of the state update back (ldmatrix). Two barriers of the row
// group a step and the block's one for the cp.async buffers. The update's B fragments are read
// before the row group's barriers, so only the exchange and the products stay on the chain.
// Same roundings as the other row sweeps (the state and V_new to bf16 before the products); the
// four-way sum adds S W^T (K dSe^T) in another order than the whole or halved keys do.

constexpr int KQ = 4;          // warps per 16 state rows
constexpr int KWQ = DK / KQ;   // key columns per warp
constexpr int TQ = C / KQ;     // tokens of V_new each warp finishes
// A warp stages its stores in its exchange slot (RowSmem::xch), which the others are done reading
// once the step's second barrier of the four has passed.
static_assert(Tile<RW, KWQ>::bytes <= RW * C * 4 && Tile<TQ, RW>::bytes <= RW * C * 4,
              "a quarter warp's exchange slot holds its staged state rows or its 16 x 16 values");

// B fragments of a Lay::Row tile's rows [0, C) (tokens) and columns [n0, n0 + KWQ): the state
// update's second operand (K forward, W reverse), read before the barrier that precedes its use.
using QuarterB = uint32_t[C / 16][KWQ / 16][4];

template <class T>
__device__ void load_quarter_b(QuarterB& f, T t, int n0) {
#pragma unroll
  for (int kb = 0; kb < C / 16; ++kb)
#pragma unroll
    for (int j = 0; j < KWQ / 16; ++j) cuda::load_b2<Lay::Row>(f[kb][j], t, n0 + 16 * j, 16 * kb);
}

// acc += a (16 x C, registers) times the operand f holds: the first half of the tokens added
// into acc, the second into a zero accumulator added last, so that the step's chain waits on
// two dependent mma per n-tile instead of four.
__device__ void mma_quarter(Frag<RW, KWQ>& acc, const AFrags<C>& a, const QuarterB& f) {
  Frag<RW, KWQ> late;
  late.fill(0.f);
#pragma unroll
  for (int kb = 0; kb < C / 16; ++kb)
#pragma unroll
    for (int j = 0; j < KWQ / 16; ++j) {
      auto& d = kb < C / 32 ? acc : late;
      cuda::mma_bf16(d.x[0][2 * j], a[kb], f[kb][j][0], f[kb][j][1]);
      cuda::mma_bf16(d.x[0][2 * j + 1], a[kb], f[kb][j][2], f[kb][j][3]);
    }
#pragma unroll
  for (int j = 0; j < KWQ / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc.x[0][j][e] += late.x[0][j][e];
}

// Tokens [TQ q, TQ q + TQ) of the row group's four 16 x 64 partials, added in quarter order.
// mine: this warp's slot (float4 per n-tile and lane); group: the row group's first warp's slot.
__device__ void quarter_sum(const Frag<RW, C>& f, float4* mine, const float4* group, int q, int bar,
                            Frag<RW, TQ>& out) {
  constexpr int slot = RW * C / 4;  // float4s per warp
  const int l = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < C / 8; ++j) mine[j * 32 + l] = make_float4(f.x[0][j][0], f.x[0][j][1], f.x[0][j][2], f.x[0][j][3]);
  cuda::group_sync(bar, KQ * 32);
#pragma unroll
  for (int t = 0; t < TQ / 8; ++t) {
    const int at = (2 * q + t) * 32 + l;
    float4 s = group[at];
#pragma unroll
    for (int w = 1; w < KQ; ++w) {
      const float4 o = group[w * slot + at];
      s.x += o.x, s.y += o.y, s.z += o.z, s.w += o.w;
    }
    out.x[0][t][0] = s.x, out.x[0][t][1] = s.y, out.x[0][t][2] = s.z, out.x[0][t][3] = s.w;
  }
}

// exp(G_L - G_j) for the token columns j of quarter q this lane holds in a 16 x 16 accumulator.
__device__ void quarter_decays(const float* G, int q, float (&e)[TQ / 8][2]) {
  const int c = TQ * q + 2 * (threadIdx.x & 3);
  const float GL = G[C - 1];
#pragma unroll
  for (int t = 0; t < TQ / 8; ++t) e[t][0] = expf(GL - G[c + 8 * t]), e[t][1] = expf(GL - G[c + 8 * t + 1]);
}

// A warp's 16 value rows x 16 tokens (bf16, one A fragment) to the [token][DV] rows
// g[j * DV + i], through its staging area (stmatrix.trans, then one 16-byte store per lane).
__device__ void store_quarter_tokens(const uint32_t (&f)[4], char* stage, bf16* g) {
  const auto st = tile_at<Tile<TQ, RW>>(stage, 0);
  cuda::store_a<Lay::Col>(f, st, 0, 0);
  __syncwarp();
  const int l = threadIdx.x & 31, r = l >> 1, c = (l & 1) * 8;
  *reinterpret_cast<uint4*>(g + r * DV + c) = *reinterpret_cast<const uint4*>(st.at(r, c));
  __syncwarp();
}

// Hands this warp's quarter of the update's A operand (16 x 16, bf16) to its row group and
// reads the whole 16 x C operand back once all four have written theirs.
__device__ void share_quarter(const uint32_t (&f)[4], Tile<RW, C> op, int q, int bar, AFrags<C>& all) {
  cuda::store_a<Lay::Row>(f, op, 0, TQ * q);
  cuda::group_sync(bar, KQ * 32);
#pragma unroll
  for (int kb = 0; kb < C / 16; ++kb) cuda::load_a<Lay::Row>(all[kb], op, 0, 16 * kb);
}

// Threads of a row-sweep block: its RG x KS warps, and with CW (quarter sweeps) the copy warp.
template <int RG, int KS, bool CW>
__host__ __device__ constexpr int row_threads() {
  return (RG * KS + (CW ? 1 : 0)) * 32;
}

// The copy warp of a quarter-sweep block (GdnCudaConfig::sweep_copy_warp; the block's last warp):
// issues step i + STAGES - 1's tiles (issue(i, buffer); zero-fills past the sweep's end) once
// every warp has met at the barrier that opens step i, the one the sweep warps wait at for step
// i's tiles. The sweep warps then spend no instruction on copies or their addresses: about half
// of a step's 507 instructions in their SASS when they issue them (270 without). on_step(i) runs
// after the barrier that opens step i (the overlap's count, gdn_core_overlap.cuh, off the chain).
template <int STAGES, class Issue, class OnStep>
__device__ void quarter_copies(int steps, Issue&& issue, OnStep&& on_step) {
  for (int i = 0; i < STAGES - 1; ++i) {
    issue(i, i);
    cuda::cp_async_commit();
  }
  for (int i = 0; i < steps; ++i) {
    cuda::cp_async_wait<STAGES - 2>();
    __syncthreads();  // step i's tiles have landed; every warp is done with the buffer refilled next
    on_step(i);
    issue(i + STAGES - 1, (i + STAGES - 1) % STAGES);
    cuda::cp_async_commit();
  }
}

// The copy warp's copy of a tile whose rows are all valid (GdnCudaConfig::sweep_copy_lines): the
// same 16-byte cp.async as TileCopy's, so the same bytes land, but lane l copies chunk l % LPR of
// rows l / LPR + RPI j, LPR lanes to a 128-byte line (or to a whole shorter row), so that a lane's
// source moves by RPI row strides per j and by constants along its row, with no predicate and no
// select. On the H200 (Nsight Compute, eighth session) the copy warp was the step's critical path:
// 548 instructions a step (SASS) for ST's 69 cp.async, issued without a pause, while the sweep
// warps waited for it at the step's barrier (28 % of ST's stall samples, 33 % of B3's from a kept
// sweep); by lines 218, and that wait fell to 5 % (B3: 15 %). Without the copy warp (sweep_copy_warp
// off) the NW sweep warps share the copies: warp w copies rows [w rows / NW, (w + 1) rows / NW).
__device__ inline void cp_async16_whole(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(cuda::smem_u32(smem)), "l"(gmem));
}
template <int NW = 1, class T>
__device__ void copy_whole_tile(T tile, const bf16* g, int64_t gstride) {
  constexpr int CPR = T::cols / 8, LPR = CPR < 8 ? CPR : 8, RPI = 32 / LPR, SEG = CPR / LPR, RW = T::rows / NW;
  static_assert(CPR % LPR == 0 && RW % RPI == 0, "each warp's lanes cover whole lines of whole rows");
  const int l = threadIdx.x & 31, r = (NW > 1 ? (threadIdx.x >> 5) % NW * RW : 0) + l / LPR, c = (l % LPR) * 8;
  const bf16* src = g + r * gstride + c;
  bf16* dst = tile.at(r, c);
#pragma unroll
  for (int j = 0; j < RW / RPI; ++j) {
#pragma unroll
    for (int sg = 0; sg < SEG; ++sg) cp_async16_whole(dst + j * RPI * T::ld + sg * LPR * 8, src + sg * LPR * 8);
    src += RPI * gstride;
  }
}

// Multicast copies (GdnCudaConfig::sweep_multicast; with the copy warp only): CB = 4 or 8 of the
// DV / 16 = 8 blocks of a (batch, head) run as one thread-block cluster, and the tiles they all
// read (W and K forward; K, W and Q reverse) leave L2 once per cluster instead of once per
// block. Block r of the cluster fetches rows [r C / CB, (r + 1) C / CB) of each with bulk copies
// multicast to all CB (cp.async.bulk ... multicast::cluster, one 256-byte row each, into the
// padded rows of every block's tile); a full barrier per stage counts the bytes in, an empty
// barrier per stage the CB blocks done with it, before any block refills it. The block's own
// tiles (U, or dO and dV_new_local) and G go on with cp.async. The same bytes land where the
// copy warp's cp.async put them, so the sweeps compute the same bits.
constexpr int kMulticastBarrierBytes = 2 * 4 * 8;  // full and empty mbarriers of up to 4 stages

// A tile all blocks of the cluster read: rows [0, valid) from src (row r at src + r * stride),
// zeros below.
struct SharedTile {
  Tile<C, DK> tile;
  const bf16* src;
  int64_t stride;
  int valid;
};
template <int N>
struct SharedTiles {
  SharedTile t[N];
};

// The step's full (bytes landed) and empty (blocks done) barriers of stage s.
struct StageBarriers {
  uint64_t* at;  // STAGES full barriers, then STAGES empty ones
  int stages;
  __device__ uint64_t* full(int s) const { return at + s; }
  __device__ uint64_t* empty(int s) const { return at + stages + s; }
};

// The copy warp's loop with multicast: as quarter_copies, but the shared tiles of step m go out
// once the cluster's blocks are all done with step m - STAGES (their empty barrier), and the
// sweep warps pass the block barrier of step i only once its bytes are in (the full barrier).
// shared(m, s) gives step m's NS SharedTiles in stage s; own(m, s) issues the block's cp.async;
// on_step as quarter_copies'.
template <int CB, int STAGES, int NS, class Shared, class Own, class OnStep>
__device__ void multicast_copies(int steps, StageBarriers bars, Shared&& shared, Own&& own, OnStep&& on_step) {
  constexpr int rows = C / CB;  // rows of each shared tile this block fetches
  static_assert(rows <= 32, "a lane per fetched row and tile");
  const int l = threadIdx.x & 31, r = cuda::cluster_rank();
  auto issue = [&](int m) {
    const int s = m % STAGES;
    const SharedTiles<NS> tiles = shared(m, s);
    int bytes = 0;
#pragma unroll
    for (int t = 0; t < NS; ++t) bytes += tiles.t[t].valid * DK * 2;
    if (l == 0) cuda::mbar_expect_tx(bars.full(s), bytes);  // all blocks' rows, mine included
    const int row = r * rows + l % rows;
#pragma unroll
    for (int t = 0; t < NS; ++t) {
      const SharedTile& x = tiles.t[t];
      if (l < rows && row < x.valid)
        cuda::bulk_copy_multicast(x.tile.at(row, 0), x.src + row * x.stride, DK * 2, bars.full(s), (1u << CB) - 1);
      for (int z = x.valid * (DK / 8) + l; z < C * (DK / 8); z += 32)  // rows past the end: zeros, in every block
        *reinterpret_cast<uint4*>(x.tile.at(z / (DK / 8), z % (DK / 8) * 8)) = make_uint4(0, 0, 0, 0);
      if (x.valid < C) cuda::fence_proxy_async();  // ordered before later bulk copies into those rows
    }
    own(m, s);
  };
  for (int m = 0; m < STAGES - 1; ++m) {
    if (m < steps) issue(m);
    cuda::cp_async_commit();
  }
  for (int i = 0; i < steps; ++i) {
    cuda::cp_async_wait<STAGES - 2>();
    cuda::mbar_wait(bars.full(i % STAGES), (i / STAGES) & 1);
    __syncthreads();  // step i is in; every warp is done with step i - 1's stage, refilled below
    on_step(i);
    const int m = i + STAGES - 1;
    if (m < steps) {
      if (i >= 1) {  // stage (i - 1) % STAGES held step i - 1 in every block: wait until all are done
        if (l < CB) cuda::mbar_arrive_cluster(bars.empty((i - 1) % STAGES), l);
        cuda::mbar_wait(bars.empty((i - 1) % STAGES), ((i - 1) / STAGES) & 1);
      }
      issue(m);
    }
    cuda::cp_async_commit();
  }
}

// Sets up a multicast sweep's barriers (thread 0) and meets the cluster, so that no block's
// bulk copy or remote arrival reaches a peer before its barriers exist.
template <int CB>
__device__ StageBarriers multicast_begin(char* at, int stages) {
  StageBarriers bars{reinterpret_cast<uint64_t*>(at), stages};
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) cuda::mbar_init(bars.full(s), 1), cuda::mbar_init(bars.empty(s), CB);
    cuda::mbar_init_fence();
  }
  cuda::cluster_sync();
  return bars;
}

// Forward sweep (ST) with key quarters: what row_forward_sweep computes, same arguments. CW: a
// copy warp issues the tiles (quarter_copies) instead of the sweep warps; CB > 0: it multicasts
// the W and K tiles to a cluster of CB blocks (multicast_copies); LINES: tiles whose rows are all
// valid are copied by copy_whole_tile (by the copy warp, or shared by the sweep warps without it).
// Same results, bitwise. kCount: the block counts the segments it
// has finished (the overlap, gdn_core_overlap.cuh).
template <int RG, int STAGES, bool CW, int CB = 0, bool kCount = false, bool LINES = false>
__device__ void quarter_forward_sweep(const Args& a, int b, int h, int row0, const float* from, float* to, char* sm) {
  using S = RowSmem<RG, KQ, STAGES, false>;
  constexpr int NT = CW ? 32 : S::NWB * 32, BV = S::BV;  // threads that copy
  const int tid = CW ? threadIdx.x & 31 : threadIdx.x;   // index among them
  const RowWarp<RG, KQ> w;
  const int q = w.kh;
  auto Wt = [&](int s) { return tile_at<Tile<C, DK>>(sm, S::W + s * S::tk); };
  auto Kt = [&](int s) { return tile_at<Tile<C, DK>>(sm, S::K + s * S::tk); };
  auto Ut = [&](int s) { return tile_at<Tile<C, BV>>(sm, S::V + s * S::tv); };
  auto Gt = [&](int s) { return reinterpret_cast<float*>(sm + S::G + s * C * 4); };
  float4* part = reinterpret_cast<float4*>(sm + S::xch);
  float4* mine = part + w.warp * (RW * C / 4);
  char* stage = reinterpret_cast<char*>(mine);
  const float4* group = part + (w.warp - q) * (RW * C / 4);
  const auto op = tile_at<Tile<RW, C>>(sm, S::op + (w.warp / KQ) * Tile<RW, C>::bytes);
  const cuda::TileCopy<NT, Tile<C, DK>> copy_rows(tid);
  const cuda::TileCopy<NT, Tile<C, BV>> copy_u(tid);

  static_assert(!LINES || CB == 0, "whole-tile copies by per-block cp.async");
  constexpr int NW = CW ? 1 : S::NWB;  // warps sharing the whole-tile copies
  auto issue = [&](int n, int s) {  // as row_forward_sweep's: zero-fills past the last sub-chunk
    const bool live = n < a.NS;
    n = min(n, a.NS - 1);
    const int t0 = n * C;
    const int64_t ws0 = a.ws_row(b, h, n);
    if constexpr (LINES) {
      if (live && t0 + C <= a.T) {
        copy_whole_tile<NW>(Wt(s), a.W + ws0 * DK, DK);
        copy_whole_tile<NW>(Kt(s), a.k + a.tok(b, t0, h) * DK, int64_t(a.H) * DK);
        copy_whole_tile<NW>(Ut(s), a.U + ws0 * DV + row0, DV);
        copy_g_async(Gt(s), a.G + ws0, tid, true);
        return;
      }
    }
    copy_rows(Wt(s), a.W + ws0 * DK, DK, live ? C : 0);
    copy_rows(Kt(s), a.k + a.tok(b, t0, h) * DK, int64_t(a.H) * DK, live ? min(C, a.T - t0) : 0);
    copy_u(Ut(s), a.U + ws0 * DV + row0, DV, live ? C : 0);
    copy_g_async(Gt(s), a.G + ws0, tid, live);
  };
  StageBarriers bars{};
  if constexpr (CB > 0) bars = multicast_begin<CB>(sm + S::bytes, STAGES);
  if constexpr (CW) {
    if (w.warp == S::NWB) {
      auto copy_warp_counts = [&](int i) {  // its first lane, after the barrier that opens step i
        if constexpr (kCount)
          if ((threadIdx.x & 31) == 0) count_at_step(a, false, i);
      };
      if constexpr (CB == 0) {
        return quarter_copies<STAGES>(a.NS, issue, copy_warp_counts);
      } else {
        auto shared = [&](int n, int s) {
          const int t0 = n * C;
          return SharedTiles<2>{{{Wt(s), a.W + a.ws_row(b, h, n) * DK, DK, C},
                                 {Kt(s), a.k + a.tok(b, t0, h) * DK, int64_t(a.H) * DK, min(C, a.T - t0)}}};
        };
        auto own = [&](int n, int s) {
          const int64_t ws0 = a.ws_row(b, h, n);
          copy_u(Ut(s), a.U + ws0 * DV + row0, DV, C);
          copy_g_async(Gt(s), a.G + ws0, tid, true);
        };
        return multicast_copies<CB, STAGES, 2>(a.NS, bars, shared, own, copy_warp_counts);
      }
    }
  }
  Frag<RW, KWQ> st;  // state rows row0 + v0.., key columns k0..
  if (from) st.each([&](int r, int c, float& x) { x = from[(w.v0 + r) * DK + w.k0 + c]; });
  else st.fill(0.f);
  for (int i = 0; i < STAGES - 1 && !CW; ++i) {
    issue(i, i);
    cuda::cp_async_commit();
  }
  // A step in the order its chain needs it (state -> S W^T -> exchange -> V_new -> exchange ->
  // update); what does not feed the chain is issued around it: the next sub-chunk's copies
  // beside the first product, the operands read ahead before the exchanges, the snapshot and
  // V_new stores after the update.
  for (int n = 0; n < a.NS; ++n) {
    const int s = n % STAGES;
    if constexpr (!CW) cuda::cp_async_wait<STAGES - 2>();
    __syncthreads();  // sub-chunk n has landed; every warp is done with the buffer refilled below
    if constexpr (kCount && !CW)
      if (threadIdx.x == 0) count_at_step(a, false, n);
    if constexpr (CB > 0) cuda::mbar_wait(bars.full(s), (n / STAGES) & 1);  // the bulk copies' bytes, seen here too
    AFrags<KWQ> sa;  // the entering state rounded to bf16: operand of S W^T and the snapshot
    cuda::acc_to_a(st, sa);
    Frag<RW, C> part_vn;  // this warp's keys' share of (S W^T): value rows, token columns
    part_vn.fill(0.f);
    cuda::mma_regs_acc<KWQ, Lay::Col>(part_vn, sa, Wt(s), 0, w.k0);
    if constexpr (!CW) {
      issue(n + STAGES - 1, (n + STAGES - 1) % STAGES);  // beside the product: a whole step ahead
      cuda::cp_async_commit();
    }
    const float* G = Gt(s);
    float e[TQ / 8][2];
    quarter_decays(G, q, e);
    const float gl = expf(G[C - 1]);
    Frag<RW, TQ> u;
    cuda::load_transposed(u, Ut(s), w.v0, TQ * q);
    QuarterB kf;
    load_quarter_b(kf, Kt(s), w.k0);
    Frag<RW, TQ> vn;  // V_new^T for tokens TQ q..: U^T - S W^T
    quarter_sum(part_vn, mine, group, q, w.pair_bar(), vn);
    vn.each([&](int r, int c, float& x) { x = u.x[0][c >> 3][(r >> 3) * 2 + (c & 1)] - x; });
    AFrags<TQ> vq, vs;  // V_new (stored) and V_new diag(e) (the update's operand), in bf16
    cuda::acc_to_a(vn, vq);
    vn.each([&](int, int c, float& x) { x *= e[c >> 3][c & 1]; });
    cuda::acc_to_a(vn, vs);
    AFrags<C> va;  // V_new^T diag(e) for all C tokens
    share_quarter(vs[0], op, q, w.pair_bar(), va);
    st.each([&](int, int, float& x) { x *= gl; });
    mma_quarter(st, va, kf);
    store_state_rows<KWQ, KWQ>(sa, stage, a.Hs + (a.ws_sub(b, h, n) * DV + row0 + w.v0) * DK + w.k0);
    store_quarter_tokens(vq[0], stage, a.Vn + (a.ws_row(b, h, n) + TQ * q) * DV + row0 + w.v0);
  }
  if constexpr (kCount) count_last_segment<S::NWB>(a, false);
  if (to) st.each([&](int r, int c, float& x) { to[(w.v0 + r) * DK + w.k0 + c] = x; });
}

// Reverse sweep (B3) with key quarters: what row_reverse_sweep computes, same arguments; CW, CB
// and LINES as the forward's (K, W and Q multicast), kCount too.
template <int RG, int STAGES, bool CW, int CB = 0, bool kCount = false, bool LINES = false>
__device__ void quarter_reverse_sweep(const Args& a, int b, int h, int row0, const float* from, float* to, char* sm) {
  using S = RowSmem<RG, KQ, STAGES, true>;
  constexpr int NT = CW ? 32 : S::NWB * 32, BV = S::BV;
  const int tid = CW ? threadIdx.x & 31 : threadIdx.x;
  const RowWarp<RG, KQ> w;
  const int q = w.kh;
  auto Kt = [&](int s) { return tile_at<Tile<C, DK>>(sm, S::K + s * S::tk); };
  auto Wt = [&](int s) { return tile_at<Tile<C, DK>>(sm, S::W + s * S::tk); };
  auto Qt = [&](int s) { return tile_at<Tile<C, DK>>(sm, S::Q + s * S::tk); };
  auto dOt = [&](int s) { return tile_at<Tile<C, BV>>(sm, S::V + s * S::tv); };
  auto dVlt = [&](int s) { return tile_at<Tile<C, BV>>(sm, S::V2 + s * S::tv); };
  auto Gt = [&](int s) { return reinterpret_cast<float*>(sm + S::G + s * C * 4); };
  float4* part = reinterpret_cast<float4*>(sm + S::xch);
  float4* mine = part + w.warp * (RW * C / 4);
  char* stage = reinterpret_cast<char*>(mine);
  const float4* group = part + (w.warp - q) * (RW * C / 4);
  const auto op = tile_at<Tile<RW, C>>(sm, S::op + (w.warp / KQ) * Tile<RW, C>::bytes);
  const cuda::TileCopy<NT, Tile<C, DK>> copy_rows(tid);
  const cuda::TileCopy<NT, Tile<C, BV>> copy_v(tid);

  static_assert(!LINES || CB == 0, "whole-tile copies by per-block cp.async");
  constexpr int NW = CW ? 1 : S::NWB;  // warps sharing the whole-tile copies
  auto issue = [&](int n, int s) {  // as row_reverse_sweep's: zero-fills for n < 0
    const bool live = n >= 0;
    n = max(n, 0);
    const int t0 = n * C, nv = live ? min(C, a.T - t0) : 0;
    const int64_t ws0 = a.ws_row(b, h, n), r0 = a.tok(b, t0, h);
    if constexpr (LINES) {
      if (nv == C) {
        copy_whole_tile<NW>(Kt(s), a.k + r0 * DK, int64_t(a.H) * DK);
        copy_whole_tile<NW>(Wt(s), a.W + ws0 * DK, DK);
        copy_whole_tile<NW>(Qt(s), a.q + r0 * DK, int64_t(a.H) * DK);
        copy_whole_tile<NW>(dOt(s), a.dO + r0 * DV + row0, int64_t(a.H) * DV);
        copy_whole_tile<NW>(dVlt(s), a.dVn + ws0 * DV + row0, DV);
        copy_g_async(Gt(s), a.G + ws0, tid, true);
        return;
      }
    }
    copy_rows(Kt(s), a.k + r0 * DK, int64_t(a.H) * DK, nv);
    copy_rows(Wt(s), a.W + ws0 * DK, DK, live ? C : 0);
    copy_rows(Qt(s), a.q + r0 * DK, int64_t(a.H) * DK, nv);
    copy_v(dOt(s), a.dO + r0 * DV + row0, int64_t(a.H) * DV, nv);
    copy_v(dVlt(s), a.dVn + ws0 * DV + row0, DV, live ? C : 0);
    copy_g_async(Gt(s), a.G + ws0, tid, live);
  };
  StageBarriers bars{};
  if constexpr (CB > 0) bars = multicast_begin<CB>(sm + S::bytes, STAGES);
  if constexpr (CW) {
    if (w.warp == S::NWB) {
      auto copy_warp_counts = [&](int i) {  // its first lane, after the barrier that opens step i
        if constexpr (kCount)
          if ((threadIdx.x & 31) == 0) count_at_step(a, true, i);
      };
      if constexpr (CB == 0) {
        return quarter_copies<STAGES>(a.NS, [&](int i, int s) { issue(a.NS - 1 - i, s); }, copy_warp_counts);
      } else {
        auto shared = [&](int i, int s) {  // step i works on sub-chunk NS - 1 - i
          const int n = a.NS - 1 - i, t0 = n * C, nv = min(C, a.T - t0);
          const int64_t r0 = a.tok(b, t0, h);
          return SharedTiles<3>{{{Kt(s), a.k + r0 * DK, int64_t(a.H) * DK, nv},
                                 {Wt(s), a.W + a.ws_row(b, h, n) * DK, DK, C},
                                 {Qt(s), a.q + r0 * DK, int64_t(a.H) * DK, nv}}};
        };
        auto own = [&](int i, int s) {
          const int n = a.NS - 1 - i, t0 = n * C, nv = min(C, a.T - t0);
          const int64_t ws0 = a.ws_row(b, h, n);
          copy_v(dOt(s), a.dO + a.tok(b, t0, h) * DV + row0, int64_t(a.H) * DV, nv);
          copy_v(dVlt(s), a.dVn + ws0 * DV + row0, DV, C);
          copy_g_async(Gt(s), a.G + ws0, tid, true);
        };
        return multicast_copies<CB, STAGES, 3>(a.NS, bars, shared, own, copy_warp_counts);
      }
    }
  }
  Frag<RW, KWQ> ds;
  if (from) ds.each([&](int r, int c, float& x) { x = from[(w.v0 + r) * DK + w.k0 + c]; });
  else ds.fill(0.f);
  for (int i = 0; i < STAGES - 1 && !CW; ++i) {  // step i works on sub-chunk NS - 1 - i
    issue(a.NS - 1 - i, i);
    cuda::cp_async_commit();
  }
  // In the order of the chain (dS -> K dSe^T -> exchange -> dV_new -> exchange -> update), as
  // the forward; the term without dV_new, s (diag(gamma) dO)^T Q, goes into an accumulator of
  // its own (off the chain) that is added to gamma_L dS before the dV_new term.
  for (int i = 0; i < a.NS; ++i) {
    const int n = a.NS - 1 - i, s = i % STAGES;
    if constexpr (!CW) cuda::cp_async_wait<STAGES - 2>();
    __syncthreads();
    if constexpr (kCount && !CW)
      if (threadIdx.x == 0) count_at_step(a, true, i);
    if constexpr (CB > 0) cuda::mbar_wait(bars.full(s), (i / STAGES) & 1);
    AFrags<KWQ> da;  // dSe, the gradient of the state leaving sub-chunk n, rounded to bf16
    cuda::acc_to_a(ds, da);
    Frag<RW, C> part_dvn;  // this warp's keys' share of (K dSe^T)^T: value rows, token columns
    part_dvn.fill(0.f);
    cuda::mma_regs_acc<KWQ, Lay::Col>(part_dvn, da, Kt(s), 0, w.k0);
    if constexpr (!CW) {
      issue(n - (STAGES - 1), (i + STAGES - 1) % STAGES);
      cuda::cp_async_commit();
    }
    const float* G = Gt(s);
    float e[TQ / 8][2];
    quarter_decays(G, q, e);
    const float gl = expf(G[C - 1]);
    Frag<RW, TQ> dl;
    cuda::load_transposed(dl, dVlt(s), w.v0, TQ * q);
    QuarterB wf;
    load_quarter_b(wf, Wt(s), w.k0);
    AFrags<C> og;
    scaled_dO_operand(og, dOt(s), w.v0, G, a.scale);
    Frag<RW, KWQ> oq;  // s (diag(gamma) dO)^T Q
    oq.fill(0.f);
    cuda::mma_regs_acc<C, Lay::Row>(oq, og, Qt(s), w.k0);
    Frag<RW, TQ> dvn;  // dV_new^T for tokens TQ q..: dV_new_local^T + e (K dSe^T)^T
    quarter_sum(part_dvn, mine, group, q, w.pair_bar(), dvn);
    dvn.each([&](int r, int c, float& x) { x = dl.x[0][c >> 3][(r >> 3) * 2 + (c & 1)] + e[c >> 3][c & 1] * x; });
    AFrags<TQ> dvq;
    cuda::acc_to_a(dvn, dvq);
    uint32_t neg[4];  // -dV_new^T in bf16: the sign bits flipped, as rounding the negated sum gives
#pragma unroll
    for (int r = 0; r < 4; ++r) neg[r] = dvq[0][r] ^ 0x80008000u;
    AFrags<C> nd;
    share_quarter(neg, op, q, w.pair_bar(), nd);
#pragma unroll
    for (int j = 0; j < KWQ / 8; ++j)
#pragma unroll
      for (int k = 0; k < 4; ++k) ds.x[0][j][k] = gl * ds.x[0][j][k] + oq.x[0][j][k];
    mma_quarter(ds, nd, wf);
    store_state_rows<KWQ, KWQ>(da, stage, a.dHs + (a.ws_sub(b, h, n) * DV + row0 + w.v0) * DK + w.k0);
    store_quarter_tokens(dvq[0], stage, a.dVn + (a.ws_row(b, h, n) + TQ * q) * DV + row0 + w.v0);
  }
  if constexpr (kCount) count_last_segment<S::NWB>(a, true);
  if (to) ds.each([&](int r, int c, float& x) { to[(w.v0 + r) * DK + w.k0 + c] = x; });
}
