// The Mamba-3 layer's per-token operations around the core (docs/mamba3.md; MATH.md 6.1,
// 6.5), forward and backward. `rows` = batch * len tokens; heads H, rank R, head size P,
// state size N, B/C groups G (head h reads group h / (H/G)), rotary angles NA <= N/2.
// Outputs are overwritten; parameter gradients (d_dt_bias, d_bias, dmimo_*) are accumulated
// (+=), as are the gradients the caller sums from several ops (noted at each one).
#pragma once
#include <cstdint>

namespace stateflow {

// Step size, log decay and trapezoid weight, per token and head ([rows, H] each):
//   dt = softplus(dd_dt + dt_bias),  adt = A dt with A = min(-softplus(dd_A), -a_floor),
//   lam = sigmoid(trap).
// Backward takes the total gradients of dt (core + angles), adt and lam.
template <class T>
void mamba3_gates_forward(const T* dd_dt, const T* dd_A, const T* trap, const T* dt_bias, T* dt, T* adt, T* lam,
                          int64_t rows, int64_t H, double a_floor);
template <class T>
void mamba3_gates_backward(const T* dd_dt, const T* dd_A, const T* trap, const T* dt_bias, const T* ddt,
                           const T* dadt, const T* dlam, T* d_dd_dt, T* d_dd_A, T* d_trap, T* d_dt_bias, int64_t rows,
                           int64_t H, double a_floor);

// Cumulative rotary angle, token by token within each sequence ([batch, len, ...] layouts):
//   theta_t = pi tanh(ang_t) [NA], shared by the heads;
//   phi_t[h] = wrap(phi_{t-1}[h] + dt_t[h] theta_t),  wrap(v) = v - 2 pi round(v / 2 pi)
// (std::remainder, which is exact), with phi_0 = phi_in (nullptr: zeros). Every token's angle is reduced to [-pi, pi], the
// same way whichever chunk it is in, so chunked == unchunked and the angle stays small
// (full float precision) over any sequence length. phi [batch, len, H, NA]; phi_out =
// the last token's phi [batch, H, NA]. The reduction has derivative 1.
// Backward: dphi [batch, len, H, NA] (from the rotations), dphi_out (nullptr: zeros) ->
// dang [batch, len, NA], ddt += [batch, len, H], dphi_in [batch, H, NA].
template <class T>
void mamba3_angles_forward(const T* ang, const T* dt, const T* phi_in, T* phi, T* phi_out, int64_t batch,
                           int64_t len, int64_t H, int64_t NA);
template <class T>
void mamba3_angles_backward(const T* ang, const T* dt, const T* dphi, const T* dphi_out, T* dang, T* ddt,
                            T* dphi_in, int64_t batch, int64_t len, int64_t H, int64_t NA);

// B or C for the core: out[row, h, r] = Rot(phi[row, h]) (bc[row, r, g(h)] + bias[h, r]),
// bc [rows, R, G, N] (RMS-normalised), bias [H, R, N], out [rows, H, R, N]. Rot turns the
// pairs (2j, 2j+1), j < NA, by the NA angles and leaves coordinates >= 2 NA alone.
// Backward from the rotated output: dbc (sum over a group's heads), dbias +=, dphi +=.
template <class T>
void mamba3_rotary_bc_forward(const T* bc, const T* bias, const T* phi, T* out, int64_t rows, int64_t H,
                              int64_t R, int64_t G, int64_t N, int64_t NA);
template <class T>
void mamba3_rotary_bc_backward(const T* dout, const T* out, const T* phi, T* dbc, T* dbias, T* dphi, int64_t rows,
                               int64_t H, int64_t R, int64_t G, int64_t N, int64_t NA);

// The rank-R inputs: X[row, h, r] = x[row, h] * mimo_x[h, r] (x [rows, H, P], X [rows, H, R, P],
// mimo_x [H, R, P]; nullptr = ones, the SISO case R = 1). Backward: dx, dmimo_x +=.
template <class T>
void mamba3_expand_x_forward(const T* x, const T* mimo_x, T* X, int64_t rows, int64_t H, int64_t R, int64_t P);
template <class T>
void mamba3_expand_x_backward(const T* x, const T* mimo_x, const T* dX, T* dx, T* dmimo_x, int64_t rows, int64_t H,
                              int64_t R, int64_t P);

// Output gate and rank combination: out[row, h] = sum_r y[row, h, r] * silu(z[row, h] * mimo_z[h, r])
// * mimo_o[h, r] (y [rows, H, R, P], z and out [rows, H, P]; mimo_* nullptr = ones).
// Backward: dy, dz, dmimo_z +=, dmimo_o +=.
template <class T>
void mamba3_output_gate_forward(const T* y, const T* z, const T* mimo_z, const T* mimo_o, T* out, int64_t rows,
                                int64_t H, int64_t R, int64_t P);
template <class T>
void mamba3_output_gate_backward(const T* y, const T* z, const T* mimo_z, const T* mimo_o, const T* dout, T* dy,
                                 T* dz, T* dmimo_z, T* dmimo_o, int64_t rows, int64_t H, int64_t R, int64_t P);

}  // namespace stateflow
