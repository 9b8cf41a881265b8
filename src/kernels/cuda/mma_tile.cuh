// Warp-level bf16 tensor-core tiles for the CUDA kernels: shared-memory tiles, cp.async
// loads, ldmatrix fragment loads and mma.sync m16n8k16 (bf16 in, fp32 accumulate).
//
// A product acc(WM x WN) += A(WM x K) * B(K x WN) reads both operands from shared memory.
// Each operand is stored row-major in one of two orientations, so transposed products need
// no copies: Lay::Row means element (i, j) of the operand sits at row i, column j of its
// tile; Lay::Col means it sits at row j, column i (the tile holds the transpose).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace stateflow::cuda {

using bf16 = __nv_bfloat16;

// A rows x cols bf16 tile in shared memory. Rows are padded by 16 bytes so that the eight
// 16-byte rows one ldmatrix reads fall into distinct banks.
template <int ROWS, int COLS>
struct Tile {
  static_assert(COLS % 8 == 0, "tile rows must be whole 16-byte chunks");
  static constexpr int rows = ROWS, cols = COLS, ld = COLS + 8;
  static constexpr int bytes = ROWS * ld * 2;
  bf16* p;
  __device__ bf16* at(int r, int c) const { return p + r * ld + c; }
};

__device__ inline uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte asynchronous global->shared copy; valid == false writes 16 zero bytes instead.
__device__ inline void cp_async16(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem),
               "r"(valid ? 16 : 0));
}
// 4-byte asynchronous global->shared copy (for destinations that are not 16-byte aligned).
__device__ inline void cp_async4(void* smem, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_u32(smem)), "l"(gmem));
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ inline void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
// Waits until at most N of this thread's most recent commit groups are still in flight.
template <int N>
__device__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Barrier over the n threads (a multiple of 32) of one group of warps (ids 1..15; 0 is __syncthreads).
__device__ inline void group_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }

// Loads rows [0, n_valid) of a tile from global memory (row r at g + r * gstride elements,
// 16-byte aligned) and zero-fills the rest; NT threads cooperate, tid in [0, NT).
template <int NT, class T>
__device__ void load_tile_async(T tile, const bf16* g, int64_t gstride, int n_valid, int tid) {
  constexpr int chunks = T::cols / 8;
  for (int i = tid; i < T::rows * chunks; i += NT) {
    const int r = i / chunks, c = (i % chunks) * 8;
    const bool ok = r < n_valid;
    cp_async16(tile.at(r, c), ok ? g + r * gstride + c : g, ok);
  }
}

// One thread's fixed share of copying a T tile with NT threads: 16-byte chunks in rows r0,
// r0 + step, ... and one column, so the offsets are computed once and every copy of the tile
// (one per sub-chunk in a sweep) is a fully unrolled run of cp.async with constant offsets.
template <int NT, class T>
struct TileCopy {
  static constexpr int chunks = T::cols / 8, step = NT / chunks, per_thread = T::rows / step;
  static_assert(NT % chunks == 0 && T::rows % step == 0, "the threads must split the tile into whole rows");
  int r0, c0;
  __device__ explicit TileCopy(int tid) : r0(tid / chunks), c0((tid % chunks) * 8) {}
  // Rows [0, n_valid) of the tile from g (row r at g + r * gstride, 16-byte aligned), zeros below.
  __device__ void operator()(T tile, const bf16* g, int64_t gstride, int n_valid = T::rows) const {
    const bf16* src = g + r0 * gstride + c0;
    bf16* dst = tile.at(r0, c0);
#pragma unroll
    for (int i = 0; i < per_thread; ++i) {
      const bool ok = r0 + i * step < n_valid;
      cp_async16(dst + i * step * T::ld, ok ? src + i * step * gstride : g, ok);
    }
  }
};

// n fp32 values (n a multiple of 4, 16-byte aligned at both ends).
template <int NT>
__device__ void load_floats_async(float* s, const float* g, int n, int tid) {
  for (int i = tid; i < n / 4; i += NT) cp_async16(s + 4 * i, g + 4 * i, true);
}

enum class Lay { Row, Col };

__device__ inline void ldmatrix_x4(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ inline void ldmatrix_x2(uint32_t (&r)[2], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_u32(p)));
}
__device__ inline void ldmatrix_x2_trans(uint32_t (&r)[2], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_u32(p)));
}

// stmatrix (sm_90 and later; store_a falls back to plain stores elsewhere).
__device__ inline void stmatrix_x4(const uint32_t (&r)[4], bf16* p) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(smem_u32(p)), "r"(r[0]),
               "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}
__device__ inline void stmatrix_x4_trans(const uint32_t (&r)[4], bf16* p) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(smem_u32(p)),
               "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

__device__ inline void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// A fragment (16 x 16 at rows m0, columns k0 of the operand).
template <Lay LA, class T>
__device__ void load_a(uint32_t (&r)[4], T t, int m0, int k0) {
  const int l = threadIdx.x & 31;
  if constexpr (LA == Lay::Row) {
    ldmatrix_x4(r, t.at(m0 + (l & 15), k0 + (l >> 4) * 8));
  } else {
    const int j = l >> 3;
    ldmatrix_x4_trans(r, t.at(k0 + (l & 7) + (j >> 1) * 8, m0 + (j & 1) * 8));
  }
}

// The inverse of load_a (stmatrix, sm_90): writes an A fragment to rows m0, columns k0 of the
// operand as stored in tile t (Lay::Col: transposed, at row k0 + j, column m0 + i).
template <Lay LA, class T>
__device__ void store_a(const uint32_t (&r)[4], T t, int m0, int k0) {
  const int l = threadIdx.x & 31;
#if __CUDA_ARCH__ >= 900
  if constexpr (LA == Lay::Row) {
    stmatrix_x4(r, t.at(m0 + (l & 15), k0 + (l >> 4) * 8));
  } else {
    const int j = l >> 3;
    stmatrix_x4_trans(r, t.at(k0 + (l & 7) + (j >> 1) * 8, m0 + (j & 1) * 8));
  }
#else  // register h holds (m0 + l / 4 + 8 (h & 1), k0 + 8 (h >> 1) + 2 (l % 4) + {0, 1})
#pragma unroll
  for (int h = 0; h < 4; ++h) {
    const int i = m0 + (l >> 2) + (h & 1) * 8, j = k0 + (h >> 1) * 8 + 2 * (l & 3);
    if constexpr (LA == Lay::Row) {
      *reinterpret_cast<uint32_t*>(t.at(i, j)) = r[h];
    } else {
      const __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(&r[h]);
      *t.at(j, i) = v.x, *t.at(j + 1, i) = v.y;
    }
  }
#endif
}

// B fragments of two 16 x 8 tiles (columns n0 and n0 + 8): r[0..1] and r[2..3].
template <Lay LB, class T>
__device__ void load_b2(uint32_t (&r)[4], T t, int n0, int k0) {
  const int l = threadIdx.x & 31;
  if constexpr (LB == Lay::Col) {
    ldmatrix_x4(r, t.at(n0 + (l & 7) + (l >> 4) * 8, k0 + ((l >> 3) & 1) * 8));
  } else {
    const int j = l >> 3;
    ldmatrix_x4_trans(r, t.at(k0 + (l & 7) + (j & 1) * 8, n0 + (j >> 1) * 8));
  }
}

// B fragment of one 16 x 8 tile.
template <Lay LB, class T>
__device__ void load_b1(uint32_t (&r)[2], T t, int n0, int k0) {
  const int l = threadIdx.x & 15;
  if constexpr (LB == Lay::Col) {
    ldmatrix_x2(r, t.at(n0 + (l & 7), k0 + (l >> 3) * 8));
  } else {
    ldmatrix_x2_trans(r, t.at(k0 + (l & 7) + (l >> 3) * 8, n0));
  }
}

// One warp's fp32 accumulator of a WM x WN output tile, in the mma.sync register layout.
template <int WM, int WN>
struct Frag {
  static_assert(WM % 16 == 0 && WN % 8 == 0, "warp tiles are made of 16 x 8 mma tiles");
  static constexpr int MT = WM / 16, NT = WN / 8;
  float x[MT][NT][4];

  __device__ void fill(float v) {
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) x[i][j][e] = v;
  }
  // f(row, col, value&) for the elements this thread holds (coordinates inside the tile).
  template <class F>
  __device__ void each(F&& f) {
    const int l = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) f(i * 16 + (l >> 2) + (e >> 1) * 8, j * 8 + 2 * (l & 3) + (e & 1), x[i][j][e]);
  }
  // f(row, col, v0&, v1&) for horizontally adjacent pairs (col, col + 1).
  template <class F>
  __device__ void each_pair(F&& f) {
    const int l = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) f(i * 16 + (l >> 2) + h * 8, j * 8 + 2 * (l & 3), x[i][j][2 * h], x[i][j][2 * h + 1]);
  }
};

// acc += A[m0 : m0+WM, 0:K] * B[0:K, n0 : n0+WN]  (operand orientations LA, LB).
template <int K, Lay LA, Lay LB, int WM, int WN, class TA, class TB>
__device__ void mma_acc(Frag<WM, WN>& acc, TA a, int m0, TB b, int n0) {
  static_assert(K % 16 == 0, "K must be a multiple of 16");
  constexpr int MT = WM / 16, NT = WN / 8;
#pragma unroll
  for (int k0 = 0; k0 < K; k0 += 16) {
    uint32_t af[MT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i) load_a<LA>(af[i], a, m0 + 16 * i, k0);
#pragma unroll
    for (int j = 0; j + 1 < NT; j += 2) {
      uint32_t bf[4];
      load_b2<LB>(bf, b, n0 + 8 * j, k0);
#pragma unroll
      for (int i = 0; i < MT; ++i) {
        mma_bf16(acc.x[i][j], af[i], bf[0], bf[1]);
        mma_bf16(acc.x[i][j + 1], af[i], bf[2], bf[3]);
      }
    }
    if constexpr (NT % 2 == 1) {
      uint32_t bf[2];
      load_b1<LB>(bf, b, n0 + 8 * (NT - 1), k0);
#pragma unroll
      for (int i = 0; i < MT; ++i) mma_bf16(acc.x[i][NT - 1], af[i], bf[0], bf[1]);
    }
  }
}

__device__ inline float bf(bf16 x) { return __bfloat162float(x); }
__device__ inline void put2(bf16* p, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
}
// Two floats rounded to bf16 in one register (lo in the low half), and back.
__device__ inline uint32_t pack2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ inline float2 unpack2(uint32_t r) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&r));
}

// Operands kept in registers (flash-attention style): the A fragments of a 16 x K operand,
// a[kb] covering columns 16 kb .. 16 kb + 15, in the register layout mma_bf16 takes.
template <int K>
using AFrags = uint32_t[K / 16][4];

// A fragments of a 16 x WN accumulator rounded to bf16: the accumulator's n-tiles 2 kb and
// 2 kb + 1 hold exactly the elements fragment kb needs, in the same lanes.
template <int WN>
__device__ void acc_to_a(const Frag<16, WN>& f, AFrags<WN>& a) {
#pragma unroll
  for (int kb = 0; kb < WN / 16; ++kb) {
    a[kb][0] = pack2(f.x[0][2 * kb][0], f.x[0][2 * kb][1]);
    a[kb][1] = pack2(f.x[0][2 * kb][2], f.x[0][2 * kb][3]);
    a[kb][2] = pack2(f.x[0][2 * kb + 1][0], f.x[0][2 * kb + 1][1]);
    a[kb][3] = pack2(f.x[0][2 * kb + 1][2], f.x[0][2 * kb + 1][3]);
  }
}

// The transpose of a tile's columns [m0, m0 + 16) x rows [k0, k0 + WN) in accumulator layout
// (element (i, j) of f = t(k0 + j, m0 + i)), fp32: an ldmatrix.trans A fragment of the tile read
// as Lay::Col holds, lane for lane, what two accumulator n-tiles hold.
template <int WN, class T>
__device__ void load_transposed(Frag<16, WN>& f, T t, int m0, int k0 = 0) {
#pragma unroll
  for (int kb = 0; kb < WN / 16; ++kb) {
    uint32_t r[4];
    load_a<Lay::Col>(r, t, m0, k0 + 16 * kb);
#pragma unroll
    for (int h = 0; h < 4; ++h) {
      const float2 v = unpack2(r[h]);
      float* x = f.x[0][2 * kb + (h >> 1)] + 2 * (h & 1);
      x[0] = v.x, x[1] = v.y;
    }
  }
}

// acc(16 x WN) += A(16 x K, fragments in registers) * B[k0 : k0 + K, n0 : n0 + WN] (B from shared memory).
template <int K, Lay LB, int WN, class TB>
__device__ void mma_regs_acc(Frag<16, WN>& acc, const AFrags<K>& a, TB b, int n0, int k0 = 0) {
  static_assert(WN % 16 == 0, "B fragments are loaded two n-tiles at a time");
#pragma unroll
  for (int kb = 0; kb < K / 16; ++kb)
#pragma unroll
    for (int j = 0; j < WN / 8; j += 2) {
      uint32_t bf[4];
      load_b2<LB>(bf, b, n0 + 8 * j, k0 + 16 * kb);
      mma_bf16(acc.x[0][j], a[kb], bf[0], bf[1]);
      mma_bf16(acc.x[0][j + 1], a[kb], bf[2], bf[3]);
    }
}

// Sum over a warp's quad (the 4 lanes holding one accumulator row); the same order in every lane.
__device__ inline float quad_sum(float s) {
  s += __shfl_xor_sync(0xffffffffu, s, 1);
  s += __shfl_xor_sync(0xffffffffu, s, 2);
  return s;
}

// A tile of type T at byte offset off of a kernel's dynamic shared memory.
template <class T>
__device__ T tile_at(char* sm, int off) {
  return T{reinterpret_cast<bf16*>(sm + off)};
}

// part[m0 + r] = sum over this warp's columns of f[r][c] * t[m0 + r][n0 + c] (fixed order).
template <int WN, class T>
__device__ void row_dot(Frag<16, WN>& f, T t, int m0, int n0, float* part) {
  float s[2] = {0.f, 0.f};
  f.each_pair([&](int r, int c, float& x0, float& x1) {
    const bf16* p = t.at(m0 + r, n0 + c);
    s[r >> 3] += x0 * bf(p[0]) + x1 * bf(p[1]);
  });
  const int l = threadIdx.x & 31;
  s[0] = quad_sum(s[0]);
  s[1] = quad_sum(s[1]);
  if ((l & 3) == 0) {
    part[m0 + (l >> 2)] = s[0];
    part[m0 + (l >> 2) + 8] = s[1];
  }
}

}  // namespace stateflow::cuda
