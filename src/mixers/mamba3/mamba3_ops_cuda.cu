// The Mamba-3 layer's per-token operations on the GPU (contract in mamba3_ops_cuda.h). Each
// backward that has a parameter gradient runs one block per (token block, sequence): its
// threads own parameter entries, walk the block's tokens in order, write the per-token
// gradients and leave one partial sum per entry for add_token_block_partials_cuda.
#include "mixers/mamba3/mamba3_ops_cuda.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/mma_tile.cuh"
#include "kernels/cuda/reduce_cuda.h"

namespace stateflow {
namespace {

using cuda::bf16;
using cuda::to_f32;

constexpr float kPi = 3.14159265358979323846f;
constexpr float kTwoPi = 6.28318530717958647692f;
constexpr int kMaxRank = 4;  // the rank-indexed accumulators below

unsigned grid_for(int64_t n) { return unsigned(std::min<int64_t>((n + 255) / 256, 65536)); }

// Tokens [t0, t1) of token block blockIdx.x of sequence blockIdx.y, as row indices.
struct TokenBlock {
  int64_t r0, r1;
  __device__ TokenBlock(int64_t len) {
    const int64_t t0 = int64_t(blockIdx.x) * kTokenBlock, t1 = min(len, t0 + kTokenBlock);
    r0 = int64_t(blockIdx.y) * len + t0, r1 = int64_t(blockIdx.y) * len + t1;
  }
  // Index of this block's partial sums (width floats each).
  __device__ int64_t partial(int64_t width) const { return (int64_t(blockIdx.y) * gridDim.x + blockIdx.x) * width; }
};

dim3 token_block_grid(int64_t len, int64_t batch) { return dim3(unsigned(token_blocks(len)), unsigned(batch)); }

size_t partial_bytes(int64_t rows, int64_t width, int64_t batch) {
  return batch > 0 ? size_t(batch * token_blocks(rows / batch) * width) * sizeof(float) : 0;
}

void check_batch(const char* name, int64_t rows, int64_t batch, const void* workspace) {
  SF_CHECK(batch > 0 && batch <= 65535 && rows % batch == 0, name, ": rows = ", rows, " is not batch = ", batch,
           " sequences of equal length");
  SF_CHECK(workspace != nullptr || rows == 0, name, ": workspace is null; allocate the *_workspace_bytes it names");
}

// ---------------------------------------------------------------------------------------
// gates
// ---------------------------------------------------------------------------------------
__global__ void gates_forward_kernel(const bf16* dd_dt, const bf16* dd_A, const bf16* trap, const float* dt_bias,
                                     float* dt, float* adt, float* lam, int64_t n, int64_t H, float a_floor) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float d = cuda::softplus(to_f32(dd_dt[i]) + dt_bias[i % H]);
    dt[i] = d;
    adt[i] = fminf(-cuda::softplus(to_f32(dd_A[i])), -a_floor) * d;
    lam[i] = cuda::sigmoid(to_f32(trap[i]));
  }
}

__global__ void gates_backward_kernel(const bf16* dd_dt, const bf16* dd_A, const bf16* trap, const float* dt_bias,
                                      const float* ddt, const float* dadt, const float* dlam, bf16* d_dd_dt,
                                      bf16* d_dd_A, bf16* d_trap, int64_t len, int64_t H, float a_floor,
                                      float* partial) {
  const TokenBlock tb(len);
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
    float acc = 0.f;
    for (int64_t row = tb.r0; row < tb.r1; ++row) {
      const int64_t i = row * H + h;
      const float u = to_f32(dd_dt[i]) + dt_bias[h], d = cuda::softplus(u);
      const float spA = cuda::softplus(to_f32(dd_A[i]));
      const bool clamped = -spA > -a_floor;  // A on the floor: no gradient to dd_A
      const float A = clamped ? -a_floor : -spA;
      const float g = (ddt[i] + dadt[i] * A) * cuda::sigmoid(u);
      d_dd_dt[i] = __float2bfloat16(g);
      d_dd_A[i] = __float2bfloat16(clamped ? 0.f : -dadt[i] * d * cuda::sigmoid(to_f32(dd_A[i])));
      const float l = cuda::sigmoid(to_f32(trap[i]));
      d_trap[i] = __float2bfloat16(dlam[i] * l * (1.f - l));
      acc += g;
    }
    partial[tb.partial(H) + h] = acc;
  }
}

// ---------------------------------------------------------------------------------------
// angles. A walk over a chunk's tokens is a chain of dependent adds, latency-bound, and one
// thread per (sequence, head, angle) is too few threads to hide it; so the forward cuts the
// chunk into segments of kTokenBlock tokens (cuts at multiples of it give the same segments):
//   local:  l_t = wrap(l_{t-1} + dt_t pi tanh(ang_t)) from l = 0 at each segment's start;
//   carry:  P_0 = phi_in,  P_{s+1} = wrap(P_s + l_last(s))  (the angle after segment s);
//   apply:  phi_t = wrap(P_s + l_t).
// Each step reduces to [-pi, pi] as the CPU's per-token rule does; the two differ only in
// rounding (the CPU adds token by token), and a chunked run gives bitwise the unchunked angles
// when its cuts are multiples of kTokenBlock.
// ---------------------------------------------------------------------------------------
constexpr int kAhead = 16;

// remainderf(v, 2 pi) bit for bit: for |v| <= pi the quotient rounds to 0 (float pi is half of
// float 2 pi, and the tie goes to the even quotient), so v is the result and the costly call
// runs only when the angle actually wraps.
__device__ float wrap_angle(float v) { return fabsf(v) <= kPi ? v : remainderf(v, kTwoPi); }

// Row of the last token of segment seg of sequence b.
__device__ int64_t segment_last_row(int64_t b, int64_t seg, int64_t len) {
  return b * len + min(len, (seg + 1) * kTokenBlock) - 1;
}

// One thread per (sequence, segment, head, angle): phi = l_t.
__global__ void angles_local_kernel(const bf16* ang, const float* dt, float* phi, int64_t batch, int64_t len,
                                    int64_t H, int64_t NA) {
  const int64_t segs = (len + kTokenBlock - 1) / kTokenBlock, k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= batch * segs * H * NA) return;
  const int64_t a = k % NA, h = (k / NA) % H, seg = (k / (NA * H)) % segs, b = k / (NA * H * segs);
  float run = 0.f;
  for (int64_t row = b * len + seg * kTokenBlock; row <= segment_last_row(b, seg, len); ++row) {
    run = wrap_angle(__fadd_rn(run, __fmul_rn(dt[row * H + h], kPi * tanhf(to_f32(ang[row * NA + a])))));
    phi[(row * H + h) * NA + a] = run;
  }
}

// One thread per (sequence, head, angle) walks the segments: each one's last angle becomes
// P_{s+1}, its final value; phi_out = the last.
__global__ void angles_carry_kernel(const float* phi_in, float* phi, float* phi_out, int64_t batch, int64_t len,
                                    int64_t H, int64_t NA) {
  const int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= batch * H * NA) return;
  const int64_t b = k / (H * NA), h = (k / NA) % H, a = k % NA, segs = (len + kTokenBlock - 1) / kTokenBlock;
  auto at = [&](int64_t seg) { return phi + (segment_last_row(b, seg, len) * H + h) * NA + a; };
  float next[kAhead];
  auto load = [&](int64_t s0) {
#pragma unroll
    for (int j = 0; j < kAhead; ++j) next[j] = s0 + j < segs ? *at(s0 + j) : 0.f;
  };
  float run = phi_in ? phi_in[k] : 0.f;
  load(0);
  for (int64_t s0 = 0; s0 < segs; s0 += kAhead) {
    float cur[kAhead];
#pragma unroll
    for (int j = 0; j < kAhead; ++j) cur[j] = next[j];
    load(s0 + kAhead);
#pragma unroll
    for (int j = 0; j < kAhead; ++j) {
      if (s0 + j >= segs) break;
      run = wrap_angle(__fadd_rn(run, cur[j]));
      *at(s0 + j) = run;
    }
  }
  phi_out[k] = run;
}

// Every angle but a segment's last: phi_t = wrap(P_s + l_t).
__global__ void angles_apply_kernel(const float* phi_in, float* phi, int64_t batch, int64_t len, int64_t H,
                                    int64_t NA) {
  const int64_t n = batch * len * H * NA;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t a = i % NA, h = (i / NA) % H, row = i / (NA * H), b = row / len, t = row % len;
    const int64_t seg = t / kTokenBlock;
    if (row == segment_last_row(b, seg, len)) continue;
    const float P = seg > 0 ? phi[(segment_last_row(b, seg - 1, len) * H + h) * NA + a]
                            : (phi_in ? phi_in[(b * H + h) * NA + a] : 0.f);
    phi[i] = wrap_angle(__fadd_rn(P, phi[i]));
  }
}

// suffix[t] = dphi_out + sum_{t' >= t} dphi[t'] per (sequence, head, angle), over dphi's
// layout, by segments as the forward: a local suffix sum per segment, then a walk over the
// segments from the last (suffix at a segment's first token = the next segment's first
// token's + the local sum), then every other token's local sum plus the next segment's.
__device__ int64_t segment_first_row(int64_t b, int64_t seg, int64_t len) { return b * len + seg * kTokenBlock; }

__global__ void angles_local_suffix_kernel(const float* dphi, float* suffix, int64_t batch, int64_t len, int64_t H,
                                           int64_t NA) {
  const int64_t segs = (len + kTokenBlock - 1) / kTokenBlock, k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= batch * segs * H * NA) return;
  const int64_t a = k % NA, h = (k / NA) % H, seg = (k / (NA * H)) % segs, b = k / (NA * H * segs);
  float s = 0.f;
  for (int64_t row = segment_last_row(b, seg, len); row >= segment_first_row(b, seg, len); --row) {
    const int64_t i = (row * H + h) * NA + a;
    s += dphi[i];
    suffix[i] = s;
  }
}

__global__ void angles_suffix_carry_kernel(const float* dphi_out, float* suffix, float* dphi_in, int64_t batch,
                                           int64_t len, int64_t H, int64_t NA) {
  const int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= batch * H * NA) return;
  const int64_t b = k / (H * NA), h = (k / NA) % H, a = k % NA, segs = (len + kTokenBlock - 1) / kTokenBlock;
  auto at = [&](int64_t seg) { return suffix + (segment_first_row(b, seg, len) * H + h) * NA + a; };
  float next[kAhead];
  auto load = [&](int64_t s1) {  // segments s1 - 1, s1 - 2, ...
#pragma unroll
    for (int j = 0; j < kAhead; ++j) next[j] = s1 - 1 - j >= 0 ? *at(s1 - 1 - j) : 0.f;
  };
  float c = dphi_out ? dphi_out[k] : 0.f;
  load(segs);
  for (int64_t s1 = segs; s1 > 0; s1 -= kAhead) {
    float cur[kAhead];
#pragma unroll
    for (int j = 0; j < kAhead; ++j) cur[j] = next[j];
    load(s1 - kAhead);
#pragma unroll
    for (int j = 0; j < kAhead; ++j) {
      if (s1 - 1 - j < 0) break;
      c += cur[j];
      *at(s1 - 1 - j) = c;
    }
  }
  dphi_in[k] = c;
}

__global__ void angles_suffix_apply_kernel(const float* dphi_out, float* suffix, int64_t batch, int64_t len, int64_t H,
                                           int64_t NA) {
  const int64_t n = batch * len * H * NA, segs = (len + kTokenBlock - 1) / kTokenBlock;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t a = i % NA, h = (i / NA) % H, row = i / (NA * H), b = row / len, seg = (row % len) / kTokenBlock;
    if (row == segment_first_row(b, seg, len)) continue;
    const float c = seg + 1 < segs ? suffix[(segment_first_row(b, seg + 1, len) * H + h) * NA + a]
                                   : (dphi_out ? dphi_out[(b * H + h) * NA + a] : 0.f);
    suffix[i] += c;
  }
}

// ddt[row, h] += sum_a suffix theta;  dang[row, a] = pi (1 - tanh^2) sum_h suffix dt.
__global__ void angles_grads_kernel(const bf16* ang, const float* dt, const float* suffix, bf16* dang, float* ddt,
                                    int64_t rows, int64_t H, int64_t NA) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < rows * H) {
    const int64_t row = i / H, h = i % H;
    float s = 0.f;
    for (int64_t a = 0; a < NA; ++a) s += suffix[(row * H + h) * NA + a] * kPi * tanhf(to_f32(ang[row * NA + a]));
    ddt[i] += s;
  } else if (i < rows * (H + NA)) {
    const int64_t j = i - rows * H, row = j / NA, a = j % NA;
    float s = 0.f;
    for (int64_t h = 0; h < H; ++h) s += suffix[(row * H + h) * NA + a] * dt[row * H + h];
    const float th = tanhf(to_f32(ang[j]));
    dang[j] = __float2bfloat16(s * kPi * (1.f - th * th));
  }
}

// ---------------------------------------------------------------------------------------
// rotary B / C: threads own coordinate pairs (2j, 2j+1)
// ---------------------------------------------------------------------------------------
__global__ void rotary_forward_kernel(const bf16* bc, const float* bias, const float* phi, bf16* out, int64_t rows,
                                      int64_t H, int64_t R, int64_t G, int64_t N, int64_t NA) {
  const int64_t half = N / 2, n = rows * H * R * half;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = i % half, r = (i / half) % R, h = (i / (half * R)) % H, row = i / (half * R * H);
    const bf16* src = bc + ((row * R + r) * G + h / (H / G)) * N + 2 * j;
    const float* bi = bias + (h * R + r) * N + 2 * j;
    float p0 = to_f32(src[0]) + bi[0], p1 = to_f32(src[1]) + bi[1];
    if (j < NA) {
      float s, c;
      sincosf(phi[(row * H + h) * NA + j], &s, &c);
      const float q0 = p0 * c - p1 * s, q1 = p0 * s + p1 * c;
      p0 = q0, p1 = q1;
    }
    cuda::put2(out + ((row * H + h) * R + r) * N + 2 * j, p0, p1);
  }
}

// Rot(phi)^T of the output gradient's pair j of (row, h, r).
__device__ float2 unrotated(const bf16* dout, const float* phi, int64_t row, int64_t h, int64_t r, int64_t j,
                            int64_t H, int64_t R, int64_t N, int64_t NA) {
  const bf16* d = dout + ((row * H + h) * R + r) * N + 2 * j;
  const float d0 = to_f32(d[0]), d1 = to_f32(d[1]);
  if (j >= NA) return make_float2(d0, d1);
  float s, c;
  sincosf(phi[(row * H + h) * NA + j], &s, &c);
  return make_float2(d0 * c + d1 * s, -d0 * s + d1 * c);
}

// dbc: one thread per (row, rank, group, pair) sums the group's heads in order.
__global__ void rotary_dbc_kernel(const bf16* dout, const float* phi, bf16* dbc, int64_t rows, int64_t H, int64_t R,
                                  int64_t G, int64_t N, int64_t NA) {
  const int64_t half = N / 2, hg = H / G, n = rows * R * G * half;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = i % half, g = (i / half) % G, r = (i / (half * G)) % R, row = i / (half * G * R);
    float2 s = make_float2(0.f, 0.f);
    for (int64_t h = g * hg; h < (g + 1) * hg; ++h) {
      const float2 u = unrotated(dout, phi, row, h, r, j, H, R, N, NA);
      s.x += u.x, s.y += u.y;
    }
    cuda::put2(dbc + ((row * R + r) * G + g) * N + 2 * j, s.x, s.y);
  }
}

// dbias partials: block (token block, sequence, slice); thread e of the slice owns pair j of
// (head, rank) and sums the block's tokens in order.
__global__ void rotary_dbias_kernel(const bf16* dout, const float* phi, int64_t len, int64_t H, int64_t R, int64_t N,
                                    int64_t NA, float* partial) {
  const TokenBlock tb(len);
  const int64_t half = N / 2, e = int64_t(blockIdx.z) * blockDim.x + threadIdx.x;
  if (e >= H * R * half) return;
  const int64_t j = e % half, r = (e / half) % R, h = e / (half * R);
  float2 s = make_float2(0.f, 0.f);
  for (int64_t row = tb.r0; row < tb.r1; ++row) {
    const float2 u = unrotated(dout, phi, row, h, r, j, H, R, N, NA);
    s.x += u.x, s.y += u.y;
  }
  float* p = partial + tb.partial(H * R * N) + (h * R + r) * N + 2 * j;
  p[0] = s.x, p[1] = s.y;
}

// dphi[row, h, j] += sum_r (-d0 out1 + d1 out0) of pair j.
__global__ void rotary_dphi_kernel(const bf16* dout, const bf16* out, float* dphi, int64_t rows, int64_t H, int64_t R,
                                   int64_t N, int64_t NA) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * H * NA) return;
  const int64_t j = i % NA, rh = i / NA;  // rh = row * H + h
  float s = 0.f;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t k = (rh * R + r) * N + 2 * j;
    s += -to_f32(dout[k]) * to_f32(out[k + 1]) + to_f32(dout[k + 1]) * to_f32(out[k]);
  }
  dphi[i] += s;
}

// ---------------------------------------------------------------------------------------
// rank expansion and output gate: thread e owns (h, p) and its R rank entries
// ---------------------------------------------------------------------------------------
__global__ void expand_x_forward_kernel(const bf16* x, const float* mimo_x, bf16* X, int64_t rows, int64_t H,
                                        int64_t R, int64_t P) {
  const int64_t n = rows * H * R * P;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t p = i % P, r = (i / P) % R, rh = i / (P * R), h = rh % H;
    X[i] = __float2bfloat16(to_f32(x[rh * P + p]) * mimo_x[(h * R + r) * P + p]);
  }
}

__global__ void expand_x_backward_kernel(const bf16* x, const float* mimo_x, const bf16* dX, bf16* dx, int64_t len,
                                         int64_t H, int64_t R, int64_t P, float* partial) {
  const TokenBlock tb(len);
  for (int64_t e = threadIdx.x; e < H * P; e += blockDim.x) {
    const int64_t h = e / P, p = e % P;
    float acc[kMaxRank] = {};
    for (int64_t row = tb.r0; row < tb.r1; ++row) {
      const float xv = to_f32(x[row * H * P + e]);
      float s = 0.f;
#pragma unroll
      for (int r = 0; r < kMaxRank; ++r) {
        if (r >= R) break;
        const float g = to_f32(dX[((row * H + h) * R + r) * P + p]);
        s += g * mimo_x[(h * R + r) * P + p];
        acc[r] += g * xv;
      }
      dx[row * H * P + e] = __float2bfloat16(s);
    }
#pragma unroll
    for (int r = 0; r < kMaxRank; ++r)
      if (r < R) partial[tb.partial(H * R * P) + (h * R + r) * P + p] = acc[r];
  }
}

__device__ float at_or_one(const float* p, int64_t i) { return p ? p[i] : 1.f; }

__global__ void output_gate_forward_kernel(const bf16* y, const bf16* z, const float* mimo_z, const float* mimo_o,
                                           bf16* out, int64_t rows, int64_t H, int64_t R, int64_t P) {
  const int64_t n = rows * H * P;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t p = i % P, rh = i / P, h = rh % H;
    const float zv = to_f32(z[i]);
    float acc = 0.f;
    for (int64_t r = 0; r < R; ++r) {
      const int64_t m = (h * R + r) * P + p;
      acc += to_f32(y[(rh * R + r) * P + p]) * cuda::silu(zv * at_or_one(mimo_z, m)) * at_or_one(mimo_o, m);
    }
    out[i] = __float2bfloat16(acc);
  }
}

// SISO (no rank parameters, so nothing to reduce): one thread per entry; the MIMO kernel below
// with its ones, bit for bit.
__global__ void output_gate_backward_siso_kernel(const bf16* y, const bf16* z, const bf16* dout, bf16* dy, bf16* dz,
                                                 int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float zv = to_f32(z[i]), d = to_f32(dout[i]), yv = to_f32(y[i]);
    float gate, gate_grad;
    cuda::silu_and_grad(zv, gate, gate_grad);
    dy[i] = __float2bfloat16(d * gate);
    dz[i] = __float2bfloat16(d * yv * gate_grad);
  }
}

// MIMO: partials of dmimo_z and dmimo_o.
__global__ void output_gate_backward_kernel(const bf16* y, const bf16* z, const float* mimo_z, const float* mimo_o,
                                            const bf16* dout, bf16* dy, bf16* dz, int64_t len, int64_t H, int64_t R,
                                            int64_t P, float* partial_z, float* partial_o) {
  const TokenBlock tb(len);
  const int64_t W = H * R * P;
  for (int64_t e = threadIdx.x; e < H * P; e += blockDim.x) {
    const int64_t h = e / P, p = e % P;
    float acc_z[kMaxRank] = {}, acc_o[kMaxRank] = {};
    for (int64_t row = tb.r0; row < tb.r1; ++row) {
      const int64_t i = row * H * P + e;
      const float zv = to_f32(z[i]), d = to_f32(dout[i]);
      float dz_acc = 0.f;
#pragma unroll
      for (int r = 0; r < kMaxRank; ++r) {
        if (r >= R) break;
        const int64_t m = (h * R + r) * P + p, k = ((row * H + h) * R + r) * P + p;
        const float mz = at_or_one(mimo_z, m), zr = zv * mz, yv = to_f32(y[k]);
        float gate, gate_grad;
        cuda::silu_and_grad(zr, gate, gate_grad);
        const float dgated = d * at_or_one(mimo_o, m);
        acc_o[r] += d * yv * gate;
        dy[k] = __float2bfloat16(dgated * gate);
        const float dzr = dgated * yv * gate_grad;
        dz_acc += dzr * mz;
        acc_z[r] += dzr * zv;
      }
      dz[i] = __float2bfloat16(dz_acc);
    }
#pragma unroll
    for (int r = 0; r < kMaxRank; ++r)
      if (r < R) {
        const int64_t m = (h * R + r) * P + p;
        partial_z[tb.partial(W) + m] = acc_z[r];
        partial_o[tb.partial(W) + m] = acc_o[r];
      }
  }
}

}  // namespace

void mamba3_gates_forward_cuda(const bf16* dd_dt, const bf16* dd_A, const bf16* trap, const float* dt_bias, float* dt,
                               float* adt, float* lam, int64_t rows, int64_t H, double a_floor, cudaStream_t stream) {
  const int64_t n = rows * H;
  if (n == 0) return;
  gates_forward_kernel<<<grid_for(n), 256, 0, stream>>>(dd_dt, dd_A, trap, dt_bias, dt, adt, lam, n, H,
                                                        float(a_floor));
  cuda_check_launch("mamba3 gates forward");
}

size_t mamba3_gates_backward_workspace_bytes(int64_t rows, int64_t H, int64_t batch) {
  return partial_bytes(rows, H, batch);
}

void mamba3_gates_backward_cuda(const bf16* dd_dt, const bf16* dd_A, const bf16* trap, const float* dt_bias,
                                const float* ddt, const float* dadt, const float* dlam, bf16* d_dd_dt, bf16* d_dd_A,
                                bf16* d_trap, float* d_dt_bias, int64_t rows, int64_t H, int64_t batch,
                                double a_floor, void* workspace, cudaStream_t stream) {
  check_batch("mamba3 gates backward", rows, batch, workspace);
  if (rows == 0) return;
  const int64_t len = rows / batch;
  auto* partial = static_cast<float*>(workspace);
  gates_backward_kernel<<<token_block_grid(len, batch), 256, 0, stream>>>(
      dd_dt, dd_A, trap, dt_bias, ddt, dadt, dlam, d_dd_dt, d_dd_A, d_trap, len, H, float(a_floor), partial);
  cuda_check_launch("mamba3 gates backward");
  add_token_block_partials_cuda(partial, batch, token_blocks(len), token_blocks(len), 1, H, d_dt_bias, stream);
}

void mamba3_angles_forward_cuda(const bf16* ang, const float* dt, const float* phi_in, float* phi, float* phi_out,
                                int64_t batch, int64_t len, int64_t H, int64_t NA, cudaStream_t stream) {
  const int64_t n = batch * H * NA;
  if (n == 0) return;
  if (len > 0) {
    angles_local_kernel<<<unsigned((n * token_blocks(len) + 255) / 256), 256, 0, stream>>>(ang, dt, phi, batch,
                                                                                           len, H, NA);
    cuda_check_launch("mamba3 angles forward (local)");
  }
  angles_carry_kernel<<<unsigned((n + 127) / 128), 128, 0, stream>>>(phi_in, phi, phi_out, batch, len, H, NA);
  cuda_check_launch("mamba3 angles forward (carry)");
  if (len > 0) {
    angles_apply_kernel<<<grid_for(n * len), 256, 0, stream>>>(phi_in, phi, batch, len, H, NA);
    cuda_check_launch("mamba3 angles forward (apply)");
  }
}

size_t mamba3_angles_backward_workspace_bytes(int64_t rows, int64_t H, int64_t NA) {
  return size_t(rows * H * NA) * sizeof(float);
}

void mamba3_angles_backward_cuda(const bf16* ang, const float* dt, const float* dphi, const float* dphi_out,
                                 bf16* dang, float* ddt, float* dphi_in, int64_t batch, int64_t len, int64_t H,
                                 int64_t NA, void* workspace, cudaStream_t stream) {
  const int64_t rows = batch * len, n = batch * H * NA;
  if (n == 0) return;
  SF_CHECK(workspace != nullptr || rows == 0, "mamba3 angles backward: workspace is null");
  auto* suffix = static_cast<float*>(workspace);
  if (rows > 0) {
    angles_local_suffix_kernel<<<unsigned((n * token_blocks(len) + 255) / 256), 256, 0, stream>>>(dphi, suffix, batch,
                                                                                                  len, H, NA);
    cuda_check_launch("mamba3 angles suffix (local)");
  }
  angles_suffix_carry_kernel<<<unsigned((n + 127) / 128), 128, 0, stream>>>(dphi_out, suffix, dphi_in, batch, len, H,
                                                                             NA);
  cuda_check_launch("mamba3 angles suffix (carry)");
  if (rows == 0) return;
  angles_suffix_apply_kernel<<<grid_for(rows * H * NA), 256, 0, stream>>>(dphi_out, suffix, batch, len, H, NA);
  cuda_check_launch("mamba3 angles suffix (apply)");
  angles_grads_kernel<<<unsigned((rows * (H + NA) + 255) / 256), 256, 0, stream>>>(ang, dt, suffix, dang, ddt, rows,
                                                                                   H, NA);
  cuda_check_launch("mamba3 angles grads");
}

void mamba3_rotary_bc_forward_cuda(const bf16* bc, const float* bias, const float* phi, bf16* out, int64_t rows,
                                   int64_t H, int64_t R, int64_t G, int64_t N, int64_t NA, cudaStream_t stream) {
  SF_CHECK(N % 2 == 0 && 2 * NA <= N && G >= 1 && H % G == 0, "mamba3 rotary: N = ", N, " must be even with NA = ",
           NA, " <= N / 2, and groups G = ", G, " must divide heads H = ", H);
  const int64_t n = rows * H * R * (N / 2);
  if (n == 0) return;
  rotary_forward_kernel<<<grid_for(n), 256, 0, stream>>>(bc, bias, phi, out, rows, H, R, G, N, NA);
  cuda_check_launch("mamba3 rotary forward");
}

size_t mamba3_rotary_bc_backward_workspace_bytes(int64_t rows, int64_t H, int64_t R, int64_t N, int64_t batch) {
  return partial_bytes(rows, H * R * N, batch);
}

void mamba3_rotary_bc_backward_cuda(const bf16* dout, const bf16* out, const float* phi, bf16* dbc, float* dbias,
                                    float* dphi, int64_t rows, int64_t H, int64_t R, int64_t G, int64_t N, int64_t NA,
                                    int64_t batch, void* workspace, cudaStream_t stream) {
  check_batch("mamba3 rotary backward", rows, batch, workspace);
  if (rows == 0) return;
  const int64_t len = rows / batch;
  auto* partial = static_cast<float*>(workspace);
  rotary_dbc_kernel<<<grid_for(rows * R * G * (N / 2)), 256, 0, stream>>>(dout, phi, dbc, rows, H, R, G, N, NA);
  cuda_check_launch("mamba3 rotary backward (dbc)");
  dim3 grid = token_block_grid(len, batch);
  grid.z = unsigned((H * R * (N / 2) + 255) / 256);
  rotary_dbias_kernel<<<grid, 256, 0, stream>>>(dout, phi, len, H, R, N, NA, partial);
  cuda_check_launch("mamba3 rotary backward (dbias)");
  add_token_block_partials_cuda(partial, batch, token_blocks(len), token_blocks(len), 1, H * R * N, dbias, stream);
  if (NA > 0) {
    rotary_dphi_kernel<<<unsigned((rows * H * NA + 255) / 256), 256, 0, stream>>>(dout, out, dphi, rows, H, R, N, NA);
    cuda_check_launch("mamba3 rotary dphi");
  }
}

void mamba3_expand_x_forward_cuda(const bf16* x, const float* mimo_x, bf16* X, int64_t rows, int64_t H, int64_t R,
                                  int64_t P, cudaStream_t stream) {
  const int64_t n = rows * H * R * P;
  if (n == 0) return;
  expand_x_forward_kernel<<<grid_for(n), 256, 0, stream>>>(x, mimo_x, X, rows, H, R, P);
  cuda_check_launch("mamba3 expand x forward");
}

size_t mamba3_rank_params_workspace_bytes(int64_t rows, int64_t H, int64_t R, int64_t P, int64_t batch) {
  return partial_bytes(rows, H * R * P, batch);
}

void mamba3_expand_x_backward_cuda(const bf16* x, const float* mimo_x, const bf16* dX, bf16* dx, float* dmimo_x,
                                   int64_t rows, int64_t H, int64_t R, int64_t P, int64_t batch, void* workspace,
                                   cudaStream_t stream) {
  SF_CHECK(R >= 1 && R <= kMaxRank, "mamba3 expand x: rank ", R, " must be in [1, ", kMaxRank, "] on the GPU");
  check_batch("mamba3 expand x backward", rows, batch, workspace);
  if (rows == 0) return;
  const int64_t len = rows / batch;
  auto* partial = static_cast<float*>(workspace);
  expand_x_backward_kernel<<<token_block_grid(len, batch), 256, 0, stream>>>(x, mimo_x, dX, dx, len, H, R, P, partial);
  cuda_check_launch("mamba3 expand x backward");
  add_token_block_partials_cuda(partial, batch, token_blocks(len), token_blocks(len), 1, H * R * P, dmimo_x, stream);
}

void mamba3_output_gate_forward_cuda(const bf16* y, const bf16* z, const float* mimo_z, const float* mimo_o, bf16* out,
                                     int64_t rows, int64_t H, int64_t R, int64_t P, cudaStream_t stream) {
  const int64_t n = rows * H * P;
  if (n == 0) return;
  output_gate_forward_kernel<<<grid_for(n), 256, 0, stream>>>(y, z, mimo_z, mimo_o, out, rows, H, R, P);
  cuda_check_launch("mamba3 output gate forward");
}

void mamba3_output_gate_backward_cuda(const bf16* y, const bf16* z, const float* mimo_z, const float* mimo_o,
                                      const bf16* dout, bf16* dy, bf16* dz, float* dmimo_z, float* dmimo_o,
                                      int64_t rows, int64_t H, int64_t R, int64_t P, int64_t batch, void* workspace,
                                      cudaStream_t stream) {
  SF_CHECK(R >= 1 && R <= kMaxRank, "mamba3 output gate: rank ", R, " must be in [1, ", kMaxRank, "] on the GPU");
  SF_CHECK((mimo_z == nullptr) == (mimo_o == nullptr) && (mimo_z == nullptr) == (dmimo_z == nullptr) &&
               (dmimo_z == nullptr) == (dmimo_o == nullptr),
           "mamba3 output gate: mimo_z, mimo_o and their gradients come together (MIMO) or not at all (SISO)");
  SF_CHECK(batch > 0 && batch <= 65535 && rows % batch == 0, "mamba3 output gate backward: rows = ", rows,
           " is not batch = ", batch, " sequences of equal length");
  SF_CHECK(workspace != nullptr || mimo_z == nullptr || rows == 0,
           "mamba3 output gate backward: workspace is null; allocate 2 x mamba3_rank_params_workspace_bytes");
  if (rows == 0) return;
  const int64_t len = rows / batch, W = H * R * P, blocks = token_blocks(len);
  if (!mimo_z) {
    output_gate_backward_siso_kernel<<<grid_for(rows * H * P), 256, 0, stream>>>(y, z, dout, dy, dz, rows * H * P);
    cuda_check_launch("mamba3 output gate backward");
    return;
  }
  float* partial_z = static_cast<float*>(workspace);
  float* partial_o = partial_z + batch * blocks * W;
  output_gate_backward_kernel<<<token_block_grid(len, batch), 256, 0, stream>>>(y, z, mimo_z, mimo_o, dout, dy, dz,
                                                                               len, H, R, P, partial_z, partial_o);
  cuda_check_launch("mamba3 output gate backward");
  const TokenBlockSum sums[] = {{partial_z, W, dmimo_z}, {partial_o, W, dmimo_o}};
  add_token_block_partials_group_cuda(sums, 2, batch, blocks, blocks, 1, stream);
}

}  // namespace stateflow
