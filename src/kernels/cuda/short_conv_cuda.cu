#include "kernels/cuda/short_conv_cuda.h"

#include <algorithm>
#include <array>
#include <initializer_list>
#include <type_traits>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/levers.h"
#include "kernels/cuda/reduce_cuda.h"

namespace stateflow {
namespace {

using cuda::bf16;

// The backward's dw terms are summed over segments of this many rows, and the segments of a
// token block in order from 0 (add_token_block_partials_cuda's block sum), whatever the tiling:
// a short chunk gives each segment a thread of its own (a 1-2K-token chunk still has tens of
// thousands of threads), and the reduction adds the segments; a long chunk gives a thread a
// whole block, which adds its segments itself as it walks, in the same order (no 4x partials to
// write and add: STATEFLOW_LEVERS_OFF=conv_walk keeps 16-row tiles at every length). Both give
// the same bits, so cuts at token blocks give the unsplit sums at any chunk length.
constexpr int kBackwardTileRows = 16;
static_assert(kTokenBlock % kBackwardTileRows == 0, "a token block is a whole number of tiles");
static_assert(kMaxConvGroup <= kMaxBlockSums, "a group's dw reductions fit one launch");
// A launch with at least this many threads of 16-row tiles walks whole blocks instead.
constexpr int64_t kMinBackwardThreads = int64_t(1) << 19;
// Both passes' tiles before this lever (STATEFLOW_LEVERS_OFF=conv_tiles, kernels/cuda/levers.h).
constexpr int kOldTileRows = int(kTokenBlock);
// The forward has no reduction, so its tile can be anything: the longest of these that still
// gives the launch kMinForwardThreads threads (fewer, longer walks re-read fewer window rows).
constexpr int kMaxForwardTileRows = 64, kMinForwardTileRows = 8;
constexpr int64_t kMinForwardThreads = int64_t(1) << 17;
constexpr int kThreads = 128;   // channel vectors per block
// Channels a thread works on (V): 2 (a warp's row of bf16 is one 128-byte line), or 8 with
// STATEFLOW_LEVERS_OFF=conv_narrow. Each channel is computed alone, so V changes no result; it
// is what the walks cost: at 8 the backward holds windows, weights and dw sums of 8 channels in
// 255 registers (ptxas, bf16, K = 4; 116 at 2), so 8 warps fit an SM, and a 2K-token chunk's
// launch has a quarter of the threads.
constexpr int kNarrow = 2, kWide = 8;
// A narrow backward walks whole token blocks (no 4x segment partials to write and add) when
// that still gives the launch this many threads (a 2K-token chunk of the GDN's three convs:
// 33 blocks x 3072 = 101K).
constexpr int64_t kMinNarrowWalkThreads = int64_t(1) << 16;
// Rows whose loads a thread issues together before using them: the walk down the rows is
// sequential, so without this each row would wait out a full memory latency. A narrow thread's
// rows are small (4 bytes a load), so it keeps more of them in flight.
constexpr int kForwardAhead = 4;
template <int V>
constexpr int kBackwardAhead = V == kWide ? 4 : 8;

// V values of a row as stored, and their store.
template <class A, int V>
using RawV = std::conditional_t<V == kWide, cuda::Raw8<A>, cuda::Raw2<A>>;
template <class A>
__device__ void store_v(A* p, const float (&v)[kWide]) { cuda::store8(p, v); }
template <class A>
__device__ void store_v(A* p, const float (&v)[kNarrow]) { cuda::store2(p, v); }
template <class A, int V>
__device__ void load_v(const A* p, float (&v)[V]) {
  RawV<A, V> r;
  cuda::load_raw(p, r);
  cuda::widen(r, v);
}

template <class A>
struct ConvArgs {
  const A *x, *prefix, *dy;
  const float *w, *dprefix_out;
  A *y, *prefix_out, *dx;
  float *dprefix_in, *partial;
  int64_t len, ch;
  int64_t tile_rows;
  int64_t seg_rows;  // backward: rows of each dw segment (tile_rows, or a quarter of a 64-row tile)
  int64_t ldx, lddx;  // row strides of x and dx (the other activations' rows are ch apart)
};

// The convs of one launch (a group of 1 for a single call), all over the same batch and len.
// A kernel takes it as a __grid_constant__ parameter: a block picks its conv by index straight
// from parameter memory, without a per-thread copy of the array.
template <class A>
struct ConvGroup {
  ConvArgs<A> conv[kMaxConvGroup];
  int64_t batch;
};

// Thread (tile, vector of V channels from c, conv i and batch b) of the launch grid: tiles
// along x, which has room for any sequence length; conv and batch along z.
struct Slot {
  int64_t c, b, tile, conv;
  __device__ Slot(int64_t batch, int V)
      : c((int64_t(blockIdx.y) * blockDim.x + threadIdx.x) * V),
        b(blockIdx.z % batch),
        tile(blockIdx.x),
        conv(blockIdx.z / batch) {}
};

// Row e of this sequence's extended input xe = [prefix; x] for V channels (CPU ExtendedInput),
// as stored: zeros outside [0, K-1+len) and for a null prefix.
template <class A, int K, int V>
__device__ void fetch_xe(const ConvArgs<A>& a, const Slot& s, int64_t e, RawV<A, V>& r) {
  constexpr int P = K - 1;
  if (e >= P && e < P + a.len) cuda::load_raw(a.x + (s.b * a.len + e - P) * a.ldx + s.c, r);
  else if (e >= 0 && e < P && a.prefix) cuda::load_raw(a.prefix + (s.b * P + e) * a.ch + s.c, r);
  else cuda::zero_raw(r);
}

template <class A, int K, int V>
__device__ void load_xe(const ConvArgs<A>& a, const Slot& s, int64_t e, float (&v)[V]) {
  RawV<A, V> r;
  fetch_xe<A, K, V>(a, s, e, r);
  cuda::widen(r, v);
}

// w[c + e, j] for the thread's V channels, as wv[j][e].
template <int K, int V>
__device__ void load_weights(const float* w, int64_t c, float (&wv)[K][V]) {
#pragma unroll
  for (int j = 0; j < K; ++j)
#pragma unroll
    for (int e = 0; e < V; ++e) wv[j][e] = w[(c + e) * K + j];
}

// The K-term pre-activation in ascending j, the CPU kernel's order.
template <int K, int V>
__device__ float conv_pre(const float (&wv)[K][V], const float (&xw)[K][V], int e) {
  float pre = 0.f;
#pragma unroll
  for (int j = 0; j < K; ++j) pre += wv[j][e] * xw[j][e];
  return pre;
}

template <int K, int V>
__device__ void shift_window(float (&win)[K][V]) {
#pragma unroll
  for (int j = 0; j + 1 < K; ++j)
#pragma unroll
    for (int e = 0; e < V; ++e) win[j][e] = win[j + 1][e];
}

template <class A, int K, int V>
__global__ void short_conv_forward_kernel(const __grid_constant__ ConvGroup<A> group) {
  constexpr int P = K - 1;
  const Slot s(group.batch, V);
  const ConvArgs<A>& a = group.conv[s.conv];
  if (s.c >= a.ch) return;
  float wv[K][V], xw[K][V];
  load_weights<K, V>(a.w, s.c, wv);
  const int64_t t0 = s.tile * a.tile_rows, t1 = min(a.len, t0 + a.tile_rows);
#pragma unroll
  for (int j = 0; j < P; ++j) load_xe<A, K, V>(a, s, t0 + j, xw[j]);
  for (int64_t t = t0; t < t1; t += kForwardAhead) {
    RawV<A, V> ahead[kForwardAhead];  // the next rows' loads are all in flight before any is used
#pragma unroll
    for (int u = 0; u < kForwardAhead; ++u) fetch_xe<A, K, V>(a, s, t + u + P, ahead[u]);
#pragma unroll
    for (int u = 0; u < kForwardAhead; ++u) {
      if (t + u >= t1) break;
      float y[V];
      cuda::widen(ahead[u], xw[P]);
#pragma unroll
      for (int e = 0; e < V; ++e) y[e] = cuda::silu(conv_pre<K, V>(wv, xw, e));
      store_v(a.y + (s.b * a.len + t + u) * a.ch + s.c, y);
      shift_window<K, V>(xw);
    }
  }
  if (s.tile == 0)  // the last K-1 rows of xe go on to the next chunk
    for (int r = 0; r < P; ++r) {
      float v[V];
      load_xe<A, K, V>(a, s, a.len + r, v);
      store_v(a.prefix_out + (s.b * P + r) * a.ch + s.c, v);
    }
}

// The thread owns outputs i in [i0, i1) of dxe (rows of [dprefix_in; dx]) and the dw terms of
// rows t in that range. It starts K-1 rows early so that the dpre window is full at i0.
template <class A, int K, int V>
__global__ void short_conv_backward_kernel(const __grid_constant__ ConvGroup<A> group, int64_t tiles) {
  constexpr int P = K - 1, Ahead = kBackwardAhead<V>;
  const Slot s(group.batch, V);
  const ConvArgs<A>& a = group.conv[s.conv];
  if (s.c >= a.ch) return;
  // dw: the current segment's terms; done: the tile's finished segments, added in order from 0
  float wv[K][V], xw[K][V], dp[K][V] = {}, dw[K][V] = {}, done[K][V] = {};
  const int64_t tile_segs = a.tile_rows / a.seg_rows;
  int64_t folded = 0;
  auto fold = [&] {
#pragma unroll
    for (int j = 0; j < K; ++j)
#pragma unroll
      for (int e = 0; e < V; ++e) done[j][e] += dw[j][e], dw[j][e] = 0.f;
    ++folded;
  };
  load_weights<K, V>(a.w, s.c, wv);
  const int64_t i0 = s.tile * a.tile_rows, i1 = min(a.len + P, i0 + a.tile_rows);
#pragma unroll
  for (int j = 0; j < P; ++j) load_xe<A, K, V>(a, s, i0 - P + j, xw[j]);
  for (int64_t t0 = i0 - P; t0 < i1; t0 += Ahead) {
    RawV<A, V> x_ahead[Ahead], dy_ahead[Ahead];  // loads in flight before use
#pragma unroll
    for (int u = 0; u < Ahead; ++u) {
      const int64_t t = t0 + u;
      fetch_xe<A, K, V>(a, s, t + P, x_ahead[u]);
      if (t >= 0 && t < a.len) cuda::load_raw(a.dy + (s.b * a.len + t) * a.ch + s.c, dy_ahead[u]);
      else cuda::zero_raw(dy_ahead[u]);
    }
#pragma unroll
    for (int u = 0; u < Ahead; ++u) {
      const int64_t t = t0 + u;
      if (t >= i1) break;
      float dy[V];
      cuda::widen(x_ahead[u], xw[P]);
      cuda::widen(dy_ahead[u], dy);
      shift_window<K, V>(dp);
#pragma unroll
      for (int e = 0; e < V; ++e)  // dy is zero outside [0, len), so dpre is too
        dp[P][e] = dy[e] * cuda::silu_grad(conv_pre<K, V>(wv, xw, e));
      if (t >= i0) {
        float out[V], dpo[V];
        if (tile_segs > 1 && t > i0 && (t - i0) % a.seg_rows == 0) fold();
        if (t < a.len)
#pragma unroll
          for (int j = 0; j < K; ++j)
#pragma unroll
            for (int e = 0; e < V; ++e) dw[j][e] += dp[P][e] * xw[j][e];
        const bool carried = a.dprefix_out && t >= a.len;
        if (carried) load_v<float, V>(a.dprefix_out + (s.b * P + t - a.len) * a.ch + s.c, dpo);
#pragma unroll
        for (int e = 0; e < V; ++e) {
            // The carried gradient holds the next chunk's terms, which come first in the unsplit
          // sum (j ascending = dpre rows descending): starting from it makes the split sum the
          // same additions. dpre[t - j] is zero outside [0, len), as the CPU kernel skips it.
          float acc = carried ? dpo[e] : 0.f;
#pragma unroll
          for (int j = 0; j < K; ++j) acc += wv[j][e] * dp[P - j][e];
          out[e] = acc;
        }
        if (t < P) store_v(a.dprefix_in + (s.b * P + t) * a.ch + s.c, out);
        else store_v(a.dx + (s.b * a.len + t - P) * a.lddx + s.c, out);
      }
      shift_window<K, V>(xw);
    }
  }
  if (tile_segs > 1)  // every segment, also those past the rows (zeros), as the reduction adds them
    while (folded < tile_segs) fold();
  float* part = a.partial + (s.b * tiles + s.tile) * a.ch * K + s.c * K;
#pragma unroll
  for (int e = 0; e < V; ++e)
#pragma unroll
    for (int j = 0; j < K; ++j) part[e * K + j] = tile_segs > 1 ? done[j][e] : dw[j][e];
}

template <class Fn>
void dispatch_conv_size(const char* name, int64_t K, Fn&& fn) {
  switch (K) {
    case 1: return fn(std::integral_constant<int, 1>{});
    case 2: return fn(std::integral_constant<int, 2>{});
    case 3: return fn(std::integral_constant<int, 3>{});
    case 4: return fn(std::integral_constant<int, 4>{});
    case 5: return fn(std::integral_constant<int, 5>{});
    case 6: return fn(std::integral_constant<int, 6>{});
    case 7: return fn(std::integral_constant<int, 7>{});
    case 8: return fn(std::integral_constant<int, 8>{});
    default: fail(name, ": conv kernel size K = ", K, " is not supported on the GPU");
  }
}

void check_shape(const char* name, int64_t batch, int64_t len, int64_t ch, int64_t K) {
  SF_CHECK(K >= 1 && K <= 8, name, ": conv kernel size K = ", K, " is not supported on the GPU (1..8); use conv_size <= 8");
  SF_CHECK(ch > 0 && ch % 8 == 0, name, ": ch = ", ch, " must be a positive multiple of 8 on the GPU");
  SF_CHECK(batch >= 0 && batch <= 65535 && len >= 0 && len + K <= (int64_t(1) << 31), name, ": batch = ", batch,
           " must be <= 65535 and len = ", len, " below 2^31 rows");
}

// The backward's tiles over the rows of [dprefix_in; dx] (K - 1 more than the chunk's), a whole
// number of token blocks of them: tiles past the chunk's rows write zero partials. `segs`
// partials per block (16-row tiles), or one per block from whole-block walks (seg_rows 16
// inside); `channels` are those of every conv in the launch, V a thread's.
struct BackwardTiling {
  int64_t rows, seg_rows, segs, tiles;
  BackwardTiling(int64_t batch, int64_t len, int64_t K, int64_t channels, int V) {
    const int64_t blocks = (len + K - 1 + kTokenBlock - 1) / kTokenBlock;
    const bool whole_blocks =
        V == kWide ? batch * blocks * (kTokenBlock / kBackwardTileRows) * (channels / V) >= kMinBackwardThreads
                   : batch * blocks * (channels / V) >= kMinNarrowWalkThreads;
    if (lever_off("conv_tiles")) rows = seg_rows = kOldTileRows;  // one unsegmented walk per block
    else if (whole_blocks && !lever_off("conv_walk")) rows = kTokenBlock, seg_rows = kBackwardTileRows;
    else rows = seg_rows = kBackwardTileRows;
    segs = kTokenBlock / rows;
    tiles = blocks * segs;
  }
};

// Tiles along x, the widest conv's vectors of V channels along y, (conv, batch) along z.
template <class Conv>
dim3 grid_for(const Conv* convs, int n, int64_t tiles, int64_t batch, int V) {
  int64_t ch = 0;
  for (int i = 0; i < n; ++i) ch = std::max(ch, convs[i].ch);
  return dim3(unsigned(tiles), unsigned((ch / V + kThreads - 1) / kThreads), unsigned(batch * n));
}

int64_t forward_tile_rows(int64_t batch, int64_t len, int64_t ch, int V) {
  int64_t rows = kMaxForwardTileRows;
  if (lever_off("conv_tiles")) return kOldTileRows;
  while (rows > kMinForwardTileRows && batch * ((len + rows - 1) / rows) * (ch / V) < kMinForwardThreads) rows /= 2;
  return rows;
}

// The calling thread's channels per thread (V).
int channels_per_thread() { return short_conv_narrow_for_thread() ? kNarrow : kWide; }

// Calls fn with V as a compile-time constant.
template <class Fn>
void dispatch_channels(int V, Fn&& fn) {
  if (V == kNarrow) fn(std::integral_constant<int, kNarrow>{});
  else fn(std::integral_constant<int, kWide>{});
}

void check_group(const char* name, int n, int64_t batch) {
  SF_CHECK(n >= 1 && n <= kMaxConvGroup, name, ": ", n, " convs in a group; 1 to ", kMaxConvGroup, " are supported");
  SF_CHECK(batch * n <= 65535, name, ": batch ", batch, " x ", n, " convs must be <= 65535 (launch grid)");
}

// One launch for all n convs (their shapes checked by the caller).
template <class A>
void launch_forward(const ShortConvForward<A>* convs, int n, int64_t batch, int64_t len, int64_t K,
                    cudaStream_t stream) {
  int64_t ch = 0;
  for (int i = 0; i < n; ++i) ch += convs[i].ch;
  const int V = channels_per_thread();
  const int64_t rows = forward_tile_rows(batch, len, ch, V);  // any tiling gives the same rows
  ConvGroup<A> group{};
  group.batch = batch;
  for (int i = 0; i < n; ++i) {
    const ShortConvForward<A>& c = convs[i];
    group.conv[i] = {c.x,  c.prefix, nullptr, c.w,  nullptr, c.y, c.prefix_out, nullptr, nullptr, nullptr,
                     len,  c.ch,     rows,    rows, c.ld_x ? c.ld_x : c.ch, 0};
  }
  // At least one tile, so that prefix_out is written also for len = 0.
  const int64_t tiles = std::max<int64_t>(1, (len + rows - 1) / rows);
  dispatch_channels(V, [&](auto v) {
    dispatch_conv_size("short_conv_forward_cuda", K, [&](auto k) {
      short_conv_forward_kernel<A, k.value, v.value>
          <<<grid_for(convs, n, tiles, batch, v.value), kThreads, 0, stream>>>(group);
      cuda_check_launch("short_conv_forward_kernel");
    });
  });
}

// dw_later (optional): the reduction is appended to it instead of issued on `stream`.
template <class A>
void launch_backward(const ShortConvBackward<A>* convs, int n, int64_t batch, int64_t len, int64_t K,
                     cudaStream_t stream, DwReduction* dw_later) {
  int64_t ch = 0;
  for (int i = 0; i < n; ++i) ch += convs[i].ch;
  const int V = channels_per_thread();
  const BackwardTiling tiling(batch, len, K, ch, V);
  if (tiling.tiles == 0) return;  // K = 1 and len = 0: nothing to do
  ConvGroup<A> group{};
  group.batch = batch;
  for (int i = 0; i < n; ++i) {
    const ShortConvBackward<A>& c = convs[i];
    group.conv[i] = {c.x,       c.prefix,     c.dy, c.w, c.dprefix_out, nullptr, nullptr, c.dx, c.dprefix_in,
                     static_cast<float*>(c.workspace), len, c.ch, tiling.rows, tiling.seg_rows,
                     c.ld_x ? c.ld_x : c.ch, c.ld_dx ? c.ld_dx : c.ch};
  }
  dispatch_channels(V, [&](auto v) {
    dispatch_conv_size("short_conv_backward_cuda", K, [&](auto k) {
      short_conv_backward_kernel<A, k.value, v.value>
          <<<grid_for(convs, n, tiling.tiles, batch, v.value), kThreads, 0, stream>>>(group, tiling.tiles);
      cuda_check_launch("short_conv_backward_kernel");
    });
  });
  // Blocks past the chunk's rows hold only prefix-gradient rows: their partials are not dw terms.
  std::array<TokenBlockSum, kMaxConvGroup> sums;
  for (int i = 0; i < n; ++i) sums[i] = {group.conv[i].partial, convs[i].ch * K, convs[i].dw};
  DwReduction reduce = [sums, n, batch, blocks = token_blocks(len), seq_stride = tiling.tiles / tiling.segs,
                        segs = tiling.segs](cudaStream_t s) {
    add_token_block_partials_group_cuda(sums.data(), n, batch, blocks, seq_stride, segs, s);
  };
  if (!dw_later) return reduce(stream);
  // one conv a launch (conv_group off) appends each conv's
  *dw_later = [before = std::move(*dw_later), reduce = std::move(reduce)](cudaStream_t s) {
    if (before) before(s);
    reduce(s);
  };
}

void check_aligned16_all(const char* name, const char* what, std::initializer_list<const void*> arrays) {
  for (const void* p : arrays)
    if (p) check_aligned16(p, name, what);
}

// The checks of one conv that depend on the pass: the activation arrays are read and written 16
// bytes at a time, and the buffers the pass writes must be there.
// A row stride of a column block: at least its width, and whole 16-byte vectors.
void check_ld(const char* name, const char* what, int64_t ld, int64_t ch) {
  SF_CHECK(ld == 0 || (ld >= ch && ld % 8 == 0), name, ": ", what, " = ", ld, " must be 0 or a multiple of 8 of at least ch = ",
           ch);
}

template <class A>
void check_conv(const char* name, const ShortConvForward<A>& c, int64_t, int64_t K) {
  check_ld(name, "ld_x", c.ld_x, c.ch);
  SF_CHECK(K == 1 || (c.prefix_out && c.prefix_out != c.prefix), name,
           ": prefix_out must be a buffer of its own (not null, and not the prefix being read)");
  check_aligned16_all(name, "x, prefix, y and prefix_out", {c.x, c.prefix, c.y, c.prefix_out});
}

template <class A>
void check_conv(const char* name, const ShortConvBackward<A>& c, int64_t batch, int64_t K) {
  check_ld(name, "ld_x", c.ld_x, c.ch), check_ld(name, "ld_dx", c.ld_dx, c.ch);
  check_aligned16_all(name, "x, prefix, dy, dprefix_out, dx and dprefix_in",
                      {c.x, c.prefix, c.dy, c.dprefix_out, c.dx, c.dprefix_in});
  SF_CHECK(K == 1 || c.dprefix_in, name, ": dprefix_in is null; it receives the gradient of the carried prefix");
  SF_CHECK(batch == 0 || c.workspace != nullptr, name,
           ": workspace is null; allocate short_conv_backward_workspace_bytes()");
}

// Checks a group's arguments, then runs it (nothing for an empty batch) as one launch, or with
// STATEFLOW_LEVERS_OFF=conv_group as one launch per conv (the results are the same either way).
template <class Conv, class Launch>
void check_and_run_group(const char* name, const Conv* convs, int n, int64_t batch, int64_t len, int64_t K,
                         Launch&& launch) {
  check_group(name, n, batch);
  for (int i = 0; i < n; ++i) {
    check_shape(name, batch, len, convs[i].ch, K);
    check_conv(name, convs[i], batch, K);
  }
  if (batch == 0) return;
  if (!lever_off("conv_group")) return launch(convs, n);
  for (int i = 0; i < n; ++i) launch(convs + i, 1);
}

}  // namespace

template <class A>
void short_conv_forward_group_cuda(const ShortConvForward<A>* convs, int n, int64_t batch, int64_t len, int64_t K,
                                   cudaStream_t stream) {
  check_and_run_group("short_conv_forward_cuda", convs, n, batch, len, K,
                      [&](const ShortConvForward<A>* some, int m) { launch_forward(some, m, batch, len, K, stream); });
}

template <class A>
void short_conv_forward_cuda(const A* x, const A* prefix, const float* w, A* y, A* prefix_out, int64_t batch,
                             int64_t len, int64_t ch, int64_t K, cudaStream_t stream) {
  const ShortConvForward<A> conv{x, prefix, w, y, prefix_out, ch};
  short_conv_forward_group_cuda<A>(&conv, 1, batch, len, K, stream);
}

size_t short_conv_backward_workspace_bytes(int64_t batch, int64_t len, int64_t ch, int64_t K) {
  // The tiling of a launch without channels: the most partials any launch writes (which one a
  // launch picks depends on all its convs' channels)
  return size_t(batch * BackwardTiling(batch, len, K, 0, kWide).tiles) * size_t(ch * K) * sizeof(float);
}

bool& short_conv_narrow_for_thread() {
  thread_local bool narrow = !lever_off("conv_narrow");
  return narrow;
}

bool short_conv_backward_walks_blocks(int64_t batch, int64_t len, int64_t channels, int64_t K) {
  const BackwardTiling tiling(batch, len, K, channels, channels_per_thread());
  return tiling.seg_rows < tiling.rows;
}

template <class A>
void short_conv_backward_group_cuda(const ShortConvBackward<A>* convs, int n, int64_t batch, int64_t len, int64_t K,
                                    cudaStream_t stream, DwReduction* dw_later) {
  if (dw_later) *dw_later = nullptr;
  check_and_run_group("short_conv_backward_cuda", convs, n, batch, len, K, [&](const ShortConvBackward<A>* some, int m) {
    launch_backward(some, m, batch, len, K, stream, dw_later);
  });
}

template <class A>
void short_conv_backward_cuda(const A* x, const A* prefix, const float* w, const A* dy, const float* dprefix_out,
                              A* dx, float* dprefix_in, float* dw, int64_t batch, int64_t len, int64_t ch, int64_t K,
                              void* workspace, cudaStream_t stream) {
  const ShortConvBackward<A> conv{x, prefix, w, dy, dprefix_out, dx, dprefix_in, dw, ch, workspace};
  short_conv_backward_group_cuda<A>(&conv, 1, batch, len, K, stream);
}

#define SF_INSTANTIATE(A)                                                                                       \
  template void short_conv_forward_group_cuda<A>(const ShortConvForward<A>*, int, int64_t, int64_t, int64_t,    \
                                                 cudaStream_t);                                                 \
  template void short_conv_backward_group_cuda<A>(const ShortConvBackward<A>*, int, int64_t, int64_t, int64_t,  \
                                                  cudaStream_t, DwReduction*);                                  \
  template void short_conv_forward_cuda<A>(const A*, const A*, const float*, A*, A*, int64_t, int64_t, int64_t, \
                                           int64_t, cudaStream_t);                                              \
  template void short_conv_backward_cuda<A>(const A*, const A*, const float*, const A*, const float*, A*,      \
                                            float*, float*, int64_t, int64_t, int64_t, int64_t, void*,          \
                                            cudaStream_t);
SF_INSTANTIATE(float)
SF_INSTANTIATE(bf16)
#undef SF_INSTANTIATE

}  // namespace stateflow
