#include "kernels/cuda/norms_cuda.h"

#include <algorithm>
#include <initializer_list>
#include <type_traits>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/levers.h"
#include "kernels/cuda/reduce_cuda.h"

namespace stateflow {
namespace {

using cuda::bf16;

enum class Norm { Rms, GatedRms, L2 };

constexpr int kWarpsPerBlock = 4;
// Rows one lane team walks in the backward, one after another: few, so that a 1-2K-token
// chunk still has hundreds of warps (at 2K tokens and a row per token, 512 warps; with 16
// longer walks the chunk tax was mostly this kernel). At 32K tokens and D = 2048 the dw
// partials are 64 MiB.
constexpr int64_t kRowsPerTeam = 4;
// Before this lever (STATEFLOW_LEVERS_OFF=norm_rows, kernels/cuda/levers.h).
constexpr int64_t kOldRowsPerTeam = 16;

template <class A>
struct NormArgs {
  const A *x = nullptr, *z = nullptr, *dy = nullptr;  // l2norm backward: x holds the forward output y
  const A* add_to_dx = nullptr;                        // rmsnorm backward: added to dx once rounded
  const float *w = nullptr, *rstd_in = nullptr;
  A *y = nullptr, *dx = nullptr, *dz = nullptr;
  float *rstd_out = nullptr, *partial = nullptr;
  int64_t rows = 0, dim = 0;
  float eps = 0.f;
  GateRows z_rows;  // where z's and dz's rows are (gated kind)
  // The offset of row `row` of z and dz.
  __device__ int64_t z_at(int64_t row) const {
    return z_rows.per_token == 0 ? row * dim : row / z_rows.per_token * z_rows.ld + row % z_rows.per_token * dim;
  }
};

// A row belongs to a team of TPR lanes (32, or 16 or 8 for narrow rows, so that a warp
// works on 32 / TPR rows at once instead of leaving lanes idle). Lane l of a team owns the
// 8-wide column vectors l, l + TPR, ... (VPT of them).
template <int TPR, int VPT>
struct Team {
  static constexpr int per_warp = 32 / TPR;
  int64_t id;  // global team index
  int lane;    // lane within the team
  __device__ Team() {
    const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    id = t / TPR, lane = int(t % TPR);
  }
  __device__ int64_t col(int j) const { return (int64_t(j) * TPR + lane) * 8; }
  // Sum over the team in a fixed butterfly order. Every lane of the warp must take part.
  __device__ static float sum(float x) {
#pragma unroll
    for (int o = TPR / 2; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
  }
};

// A launch's rows: first, or with Pair (two L2 norms of the same shape in one launch,
// l2norm_pair) first for blockIdx.y 0 and second for 1, copied field by field into registers
// (a reference into the parameters would make every use a load through a generic address).
template <bool Pair, class A>
__device__ NormArgs<A> launch_rows(const NormArgs<A>& first, const NormArgs<A>& second) {
  if constexpr (Pair) return blockIdx.y == 0 ? first : second;
  return first;
}

template <class A, int TPR, int VPT, Norm K, bool Pair>
__global__ void norm_forward_kernel(NormArgs<A> first, NormArgs<A> second) {
  const NormArgs<A> a = launch_rows<Pair>(first, second);
  const Team<TPR, VPT> T;
  const int64_t row = T.id;
  const bool valid = row < a.rows;  // no early return: the team sum needs every lane
  float xv[VPT][8], ss = 0.f;
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    if (valid && T.col(j) < a.dim) {
      cuda::load8(a.x + row * a.dim + T.col(j), xv[j]);
#pragma unroll
      for (int e = 0; e < 8; ++e) ss += xv[j][e] * xv[j][e];
    }
  }
  ss = T.sum(ss);
  if (!valid) return;
  const float r = 1.f / sqrtf(K == Norm::L2 ? ss + a.eps : ss / float(a.dim) + a.eps);
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const int64_t c = T.col(j);
    if (c >= a.dim) continue;
    float y[8], w[8], z[8];
    if constexpr (K != Norm::L2) cuda::load8(a.w + c, w);
    if constexpr (K == Norm::GatedRms) cuda::load8(a.z + a.z_at(row) + c, z);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      y[e] = xv[j][e] * r;
      if constexpr (K != Norm::L2) y[e] *= w[e];
      if constexpr (K == Norm::GatedRms) y[e] *= cuda::silu(z[e]);
    }
    cuda::store8(a.y + row * a.dim + c, y);
  }
  if (T.lane == 0) a.rstd_out[row] = r;
}

// Which rows a lane team walks: team (b, k, q) owns segment q of token block k of sequence b,
// seg_rows rows of it in order (the L2 kind: one row per team). Every team runs seg_rows
// rounds, so the team sums of a warp stay converged.
struct TeamRows {
  int64_t seq_rows, block_rows, seg_rows, blocks, segs, teams;
  TeamRows(int64_t rows, const TokenRows& t, bool per_row) {
    seq_rows = t.batch > 0 ? rows / t.batch : 0;
    block_rows = per_row ? 1 : kTokenBlock * t.rows_per_token;
    const int64_t team_rows = lever_off("norm_rows") ? kOldRowsPerTeam : kRowsPerTeam;
    segs = per_row ? 1 : (block_rows + team_rows - 1) / team_rows;
    seg_rows = (block_rows + segs - 1) / segs;
    blocks = (seq_rows + block_rows - 1) / block_rows;
    teams = t.batch * blocks * segs;
  }
  // The row of round r of team id, or -1.
  __host__ __device__ int64_t row(int64_t id, int64_t r) const {
    const int64_t q = id % segs, bk = id / segs, k = bk % blocks, b = bk / blocks;
    const int64_t in_block = q * seg_rows + r, in_seq = k * block_rows + in_block;
    return id < teams && in_block < block_rows && in_seq < seq_rows ? b * seq_rows + in_seq : -1;
  }
};

// Two passes over each row (the second re-reads it from cache): the first forms the row's
// dot product, the second the gradients. RMS kinds leave the team's dw sums in partial[team].
// The second pass's loads wait for the stores before them (the compiler cannot tell that dx is
// no input), so the fused residual's, which are not in cache, came one memory latency after
// another, 8 columns at a time. Staged: they are issued with the row's first pass instead, in
// registers (ptxas: 124 -> 164 a thread for 2048-wide bf16 rows; rows whose residual would take
// more than 128 bytes a lane stay as they were, as with STATEFLOW_LEVERS_OFF=norm_staged).
// Same arithmetic.
constexpr size_t kMaxStagedBytes = 128;
template <class A, int TPR, int VPT, Norm K, bool Staged, bool Pair>
__global__ void norm_backward_kernel(NormArgs<A> first, NormArgs<A> second, TeamRows tr) {
  const NormArgs<A> a = launch_rows<Pair>(first, second);
  const Team<TPR, VPT> T;
  if ((T.id - T.id % T.per_warp) >= tr.teams) return;  // whole warps only
  constexpr bool has_w = K != Norm::L2;
  constexpr bool stage = Staged && K == Norm::Rms && VPT * sizeof(cuda::Raw8<A>) <= kMaxStagedBytes;
  float dw[VPT][8] = {};  // w is re-read per row (from L1) rather than held: registers go to dw
  for (int64_t round = 0; round < tr.seg_rows; ++round) {
    const int64_t row = tr.row(T.id, round);
    const bool valid = row >= 0;
    const float r = valid ? a.rstd_in[row] : 0.f;
    const int64_t off = row * a.dim, z_off = K == Norm::GatedRms && valid ? a.z_at(row) : 0;
    const bool add_residual = K == Norm::Rms && a.add_to_dx;
    cuda::Raw8<A> staged_add[VPT];
    if constexpr (stage) {
#pragma unroll
      for (int j = 0; j < VPT; ++j)
        if (add_residual && valid && T.col(j) < a.dim) cuda::load_raw(a.add_to_dx + off + T.col(j), staged_add[j]);
    }
    float dot = 0.f;
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      const int64_t c = T.col(j);
      if (!valid || c >= a.dim) continue;
      float x[8], dy[8], z[8], w[8];
      cuda::load8(a.x + off + c, x), cuda::load8(a.dy + off + c, dy);
      if constexpr (K == Norm::GatedRms) cuda::load8(a.z + z_off + c, z);
      if constexpr (has_w) cuda::load8(a.w + c, w);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        if constexpr (K == Norm::L2) {
          dot += x[e] * dy[e];
        } else {
          float dn = dy[e] * w[e];
          if constexpr (K == Norm::GatedRms) dn *= cuda::silu(z[e]);
          dot += dn * (x[e] * r);
        }
      }
    }
    dot = T.sum(dot);
    const float mean = dot / float(a.dim);
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      const int64_t c = T.col(j);
      if (!valid || c >= a.dim) continue;
      float x[8], dy[8], z[8], w[8], dx[8], dz[8];
      cuda::load8(a.x + off + c, x), cuda::load8(a.dy + off + c, dy);
      if constexpr (K == Norm::GatedRms) cuda::load8(a.z + z_off + c, z);
      if constexpr (has_w) cuda::load8(a.w + c, w);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        if constexpr (K == Norm::L2) {
          dx[e] = r * (dy[e] - x[e] * dot);
        } else {
          const float n = x[e] * r;
          float dn = dy[e] * w[e];
          if constexpr (K == Norm::GatedRms) {
            float gate, gate_grad;
            cuda::silu_and_grad(z[e], gate, gate_grad);
            dn *= gate;
            dz[e] = dy[e] * n * w[e] * gate_grad;
            dw[j][e] += dy[e] * (n * gate);
          } else {
            dw[j][e] += dy[e] * n;
          }
          dx[e] = r * (dn - x[e] * r * mean);
        }
      }
      if (add_residual) {  // as add_inplace_cuda on the stored dx: A(A(dx) + add)
        float add[8];
        if constexpr (stage) cuda::widen(staged_add[j], add);
        else cuda::load8(a.add_to_dx + off + c, add);
#pragma unroll
        for (int e = 0; e < 8; ++e) dx[e] = __fadd_rn(float(A(dx[e])), add[e]);  // no FMA with dx's product
      }
      cuda::store8(a.dx + off + c, dx);
      if constexpr (K == Norm::GatedRms) cuda::store8(a.dz + z_off + c, dz);
    }
  }
  if constexpr (has_w) {
    if (T.id >= tr.teams) return;
#pragma unroll
    for (int j = 0; j < VPT; ++j)
      if (T.col(j) < a.dim) cuda::store8(a.partial + T.id * a.dim + T.col(j), dw[j]);
  }
}

// Calls fn(TPR, VPT): the team width and vectors per lane (powers of two) that cover dim.
template <class Fn>
void dispatch_width(const char* kernel, int64_t dim, Fn&& fn) {
  SF_CHECK(dim > 0 && dim % 8 == 0 && dim <= 4096, kernel, ": dim = ", dim,
           " must be a multiple of 8 and at most 4096 on the GPU");
  using std::integral_constant;
  const int64_t nvec = dim / 8;
  if (nvec <= 8) fn(integral_constant<int, 8>{}, integral_constant<int, 1>{});
  else if (nvec <= 16) fn(integral_constant<int, 16>{}, integral_constant<int, 1>{});
  else if (nvec <= 32) fn(integral_constant<int, 32>{}, integral_constant<int, 1>{});
  else if (nvec <= 64) fn(integral_constant<int, 32>{}, integral_constant<int, 2>{});
  else if (nvec <= 128) fn(integral_constant<int, 32>{}, integral_constant<int, 4>{});
  else if (nvec <= 256) fn(integral_constant<int, 32>{}, integral_constant<int, 8>{});
  else fn(integral_constant<int, 32>{}, integral_constant<int, 16>{});
}

unsigned blocks_for_teams(int64_t teams, int tpr) {
  const int64_t threads = teams * tpr, per_block = kWarpsPerBlock * 32;
  return unsigned((threads + per_block - 1) / per_block);
}

// second (optional): the rows of another norm of the same shape, in the same launch.
template <Norm K, class A>
void norm_forward(const char* name, const NormArgs<A>& a, cudaStream_t stream, const NormArgs<A>* second = nullptr) {
  for (const NormArgs<A>* n : {&a, second})
    if (n)
      for (const void* p : {static_cast<const void*>(n->x), static_cast<const void*>(n->z),
                            static_cast<const void*>(n->w), static_cast<const void*>(n->y)})
        if (p) check_aligned16(p, name, "every row pointer");
  dispatch_width(name, a.dim, [&](auto tpr, auto vpt) {
    if (a.rows == 0) return;
    const unsigned blocks = blocks_for_teams(a.rows, tpr.value);
    if constexpr (K == Norm::L2)  // the only kind run in pairs
      if (second) {
        norm_forward_kernel<A, tpr.value, vpt.value, K, true><<<dim3{blocks, 2}, kWarpsPerBlock * 32, 0, stream>>>(a, *second);
        return cuda_check_launch(name);
      }
    norm_forward_kernel<A, tpr.value, vpt.value, K, false><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(a, a);
    cuda_check_launch(name);
  });
}

// second (optional, L2 only): the rows of another norm of the same shape, in the same launch.
// dw_later (optional): where the dw reduction goes instead of onto `stream`.
template <Norm K, class A>
void norm_backward(const char* name, NormArgs<A> a, float* dw, const TokenRows& tokens, void* workspace,
                   cudaStream_t stream, const NormArgs<A>* second = nullptr, DwReduction* dw_later = nullptr) {
  SF_CHECK(tokens.batch > 0 && tokens.rows_per_token > 0 && a.rows % (tokens.batch * tokens.rows_per_token) == 0,
           name, ": rows = ", a.rows, " is not batch ", tokens.batch, " x tokens x ", tokens.rows_per_token,
           " rows per token");
  for (const NormArgs<A>* n : std::initializer_list<const NormArgs<A>*>{&a, second})
    if (n)
      for (const void* p : {static_cast<const void*>(n->x), static_cast<const void*>(n->z),
                            static_cast<const void*>(n->w), static_cast<const void*>(n->dy),
                            static_cast<const void*>(n->dx), static_cast<const void*>(n->dz),
                            static_cast<const void*>(n->add_to_dx)})
        if (p) check_aligned16(p, name, "every row pointer");
  dispatch_width(name, a.dim, [&](auto tpr, auto vpt) {
    if (a.rows == 0) return;
    const TeamRows tr(a.rows, tokens, K == Norm::L2);
    if (K != Norm::L2) {
      SF_CHECK(workspace != nullptr, name, ": workspace is null; allocate norm_backward_workspace_bytes(rows, dim)");
      a.partial = static_cast<float*>(workspace);
    }
    const unsigned blocks = blocks_for_teams(tr.teams, tpr.value);
    auto launch = [&](auto staged) {
      norm_backward_kernel<A, tpr.value, vpt.value, K, staged.value, false>
          <<<blocks, kWarpsPerBlock * 32, 0, stream>>>(a, a, tr);
    };
    if constexpr (K == Norm::Rms) {  // the only kind with a residual to stage
      if (norm_staged_for_thread()) launch(std::true_type{});
      else launch(std::false_type{});
    } else if constexpr (K == Norm::L2) {  // the only kind run in pairs
      if (second)
        norm_backward_kernel<A, tpr.value, vpt.value, K, false, true>
            <<<dim3{blocks, 2}, kWarpsPerBlock * 32, 0, stream>>>(a, *second, tr);
      else
        launch(std::false_type{});
    } else {
      launch(std::false_type{});
    }
    cuda_check_launch(name);
    if (K == Norm::L2) return;
    DwReduction reduce = [partial = a.partial, batch = tokens.batch, blocks = tr.blocks, segs = tr.segs, dim = a.dim,
                          dw](cudaStream_t s) {
      add_token_block_partials_cuda(partial, batch, blocks, blocks, segs, dim, dw, s);
    };
    if (dw_later) *dw_later = std::move(reduce);
    else reduce(stream);
  });
}

GateRows checked_gate_rows(const char* name, const GateRows& z, int64_t rows, int64_t dim) {
  SF_CHECK(z.per_token == 0 || (z.per_token > 0 && rows % z.per_token == 0 && z.ld >= z.per_token * dim && z.ld % 8 == 0),
           name, ": z rows of ", z.per_token, " a token in rows of ", z.ld, " values do not hold ", rows, " rows of ",
           dim, " (ld must be a multiple of 8, at least per_token x dim, and per_token divide the rows)");
  return z;
}

}  // namespace

bool& norm_staged_for_thread() {
  thread_local bool staged = !lever_off("norm_staged");
  return staged;
}

bool& l2norm_pair_for_thread() {
  thread_local bool pair = !lever_off("l2norm_pair");
  return pair;
}

size_t norm_backward_workspace_bytes(int64_t rows, int64_t dim, const TokenRows& tokens) {
  return size_t(TeamRows(rows, tokens, false).teams) * size_t(dim) * sizeof(float);
}

template <class A>
void rmsnorm_forward_cuda(const A* x, const float* w, A* y, float* rstd, int64_t rows, int64_t dim, double eps,
                          cudaStream_t stream) {
  NormArgs<A> a;
  a.x = x, a.w = w, a.y = y, a.rstd_out = rstd, a.rows = rows, a.dim = dim, a.eps = float(eps);
  norm_forward<Norm::Rms>("rmsnorm_forward_cuda", a, stream);
}

template <class A>
void rmsnorm_backward_cuda(const A* x, const float* w, const float* rstd, const A* dy, A* dx, float* dw,
                           int64_t rows, int64_t dim, const TokenRows& tokens, void* workspace,
                           cudaStream_t stream, const A* add_to_dx, DwReduction* dw_later) {
  NormArgs<A> a;
  a.x = x, a.w = w, a.rstd_in = rstd, a.dy = dy, a.dx = dx, a.rows = rows, a.dim = dim;
  a.add_to_dx = add_to_dx;
  norm_backward<Norm::Rms, A>("rmsnorm_backward_cuda", a, dw, tokens, workspace, stream, nullptr, dw_later);
}

template <class A>
void gated_rmsnorm_forward_cuda(const A* x, const A* z, const float* w, A* y, float* rstd, int64_t rows,
                                int64_t dim, double eps, cudaStream_t stream, GateRows z_rows) {
  NormArgs<A> a;
  a.x = x, a.z = z, a.w = w, a.y = y, a.rstd_out = rstd, a.rows = rows, a.dim = dim, a.eps = float(eps);
  a.z_rows = checked_gate_rows("gated_rmsnorm_forward_cuda", z_rows, rows, dim);
  norm_forward<Norm::GatedRms>("gated_rmsnorm_forward_cuda", a, stream);
}

template <class A>
void gated_rmsnorm_backward_cuda(const A* x, const A* z, const float* w, const float* rstd, const A* dy, A* dx,
                                 A* dz, float* dw, int64_t rows, int64_t dim, const TokenRows& tokens, void* workspace,
                                 cudaStream_t stream, GateRows z_rows, DwReduction* dw_later) {
  NormArgs<A> a;
  a.x = x, a.z = z, a.w = w, a.rstd_in = rstd, a.dy = dy, a.dx = dx, a.dz = dz, a.rows = rows, a.dim = dim;
  a.z_rows = checked_gate_rows("gated_rmsnorm_backward_cuda", z_rows, rows, dim);
  norm_backward<Norm::GatedRms, A>("gated_rmsnorm_backward_cuda", a, dw, tokens, workspace, stream, nullptr, dw_later);
}

template <class A>
void l2norm_forward_cuda(const A* x, A* y, float* rstd, int64_t rows, int64_t dim, double eps, cudaStream_t stream) {
  NormArgs<A> a;
  a.x = x, a.y = y, a.rstd_out = rstd, a.rows = rows, a.dim = dim, a.eps = float(eps);
  norm_forward<Norm::L2>("l2norm_forward_cuda", a, stream);
}

template <class A>
void l2norm_backward_cuda(const A* y, const float* rstd, const A* dy, A* dx, int64_t rows, int64_t dim,
                          cudaStream_t stream) {
  NormArgs<A> a;
  a.x = y, a.rstd_in = rstd, a.dy = dy, a.dx = dx, a.rows = rows, a.dim = dim;
  norm_backward<Norm::L2>("l2norm_backward_cuda", a, nullptr, TokenRows{}, nullptr, stream);
}

template <class A>
void l2norm_forward_pair_cuda(const L2NormRows<A> (&norms)[2], int64_t rows, int64_t dim, double eps,
                              cudaStream_t stream) {
  NormArgs<A> a[2];
  for (int i = 0; i < 2; ++i)
    a[i].x = norms[i].x, a[i].y = norms[i].y, a[i].rstd_out = norms[i].rstd, a[i].rows = rows, a[i].dim = dim,
    a[i].eps = float(eps);
  if (!l2norm_pair_for_thread()) {
    for (const NormArgs<A>& one : a) norm_forward<Norm::L2>("l2norm_forward_cuda", one, stream);
    return;
  }
  norm_forward<Norm::L2>("l2norm_forward_pair_cuda", a[0], stream, &a[1]);
}

template <class A>
void l2norm_backward_pair_cuda(const L2NormRows<A> (&norms)[2], int64_t rows, int64_t dim, cudaStream_t stream) {
  NormArgs<A> a[2];
  for (int i = 0; i < 2; ++i)
    a[i].x = norms[i].y, a[i].rstd_in = norms[i].rstd, a[i].dy = norms[i].dy, a[i].dx = norms[i].dx,
    a[i].rows = rows, a[i].dim = dim;
  if (!l2norm_pair_for_thread()) {
    for (const NormArgs<A>& one : a)
      norm_backward<Norm::L2>("l2norm_backward_cuda", one, nullptr, TokenRows{}, nullptr, stream);
    return;
  }
  norm_backward<Norm::L2>("l2norm_backward_pair_cuda", a[0], nullptr, TokenRows{}, nullptr, stream, &a[1]);
}

#define SF_INSTANTIATE(A)                                                                                        \
  template void rmsnorm_forward_cuda<A>(const A*, const float*, A*, float*, int64_t, int64_t, double,           \
                                        cudaStream_t);                                                          \
  template void rmsnorm_backward_cuda<A>(const A*, const float*, const float*, const A*, A*, float*, int64_t,   \
                                         int64_t, const TokenRows&, void*, cudaStream_t, const A*, DwReduction*); \
  template void gated_rmsnorm_forward_cuda<A>(const A*, const A*, const float*, A*, float*, int64_t, int64_t,   \
                                              double, cudaStream_t, GateRows);                                  \
  template void gated_rmsnorm_backward_cuda<A>(const A*, const A*, const float*, const float*, const A*, A*,    \
                                               A*, float*, int64_t, int64_t, const TokenRows&, void*, cudaStream_t, \
                                               GateRows, DwReduction*);                                         \
  template void l2norm_forward_cuda<A>(const A*, A*, float*, int64_t, int64_t, double, cudaStream_t);           \
  template void l2norm_backward_cuda<A>(const A*, const float*, const A*, A*, int64_t, int64_t, cudaStream_t);    \
  template void l2norm_forward_pair_cuda<A>(const L2NormRows<A>(&)[2], int64_t, int64_t, double, cudaStream_t);   \
  template void l2norm_backward_pair_cuda<A>(const L2NormRows<A>(&)[2], int64_t, int64_t, cudaStream_t);
SF_INSTANTIATE(float)
SF_INSTANTIATE(bf16)
#undef SF_INSTANTIATE

}  // namespace stateflow
