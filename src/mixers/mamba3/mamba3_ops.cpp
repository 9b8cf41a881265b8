#include "mixers/mamba3/mamba3_ops.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "kernels/cpu/activations.h"

namespace stateflow {
namespace {

template <class T> T wrap_angle(T v) { return std::remainder(v, T(2 * std::numbers::pi)); }
template <class T> T theta_of(T ang) { return T(std::numbers::pi) * std::tanh(ang); }
template <class T> T at_or_one(const T* p, int64_t i) { return p ? p[i] : T(1); }

}  // namespace

template <class T>
void mamba3_gates_forward(const T* dd_dt, const T* dd_A, const T* trap, const T* dt_bias, T* dt, T* adt, T* lam,
                          int64_t rows, int64_t H, double a_floor) {
  for (int64_t i = 0; i < rows * H; ++i) {
    dt[i] = softplus(dd_dt[i] + dt_bias[i % H]);
    adt[i] = std::min(-softplus(dd_A[i]), T(-a_floor)) * dt[i];
    lam[i] = sigmoid(trap[i]);
  }
}

template <class T>
void mamba3_gates_backward(const T* dd_dt, const T* dd_A, const T* trap, const T* dt_bias, const T* ddt,
                           const T* dadt, const T* dlam, T* d_dd_dt, T* d_dd_A, T* d_trap, T* d_dt_bias, int64_t rows,
                           int64_t H, double a_floor) {
  for (int64_t i = 0; i < rows * H; ++i) {
    const T u = dd_dt[i] + dt_bias[i % H];
    const T dt = softplus(u), sp_A = softplus(dd_A[i]);
    const bool clamped = -sp_A > T(-a_floor);  // A sits on the floor: no gradient to dd_A
    const T A = clamped ? T(-a_floor) : -sp_A;
    const T ddt_total = ddt[i] + dadt[i] * A;
    d_dd_dt[i] = ddt_total * sigmoid(u);
    d_dt_bias[i % H] += d_dd_dt[i];
    d_dd_A[i] = clamped ? T(0) : -dadt[i] * dt * sigmoid(dd_A[i]);
    const T l = sigmoid(trap[i]);
    d_trap[i] = dlam[i] * l * (T(1) - l);
  }
}

template <class T>
void mamba3_angles_forward(const T* ang, const T* dt, const T* phi_in, T* phi, T* phi_out, int64_t batch,
                           int64_t len, int64_t H, int64_t NA) {
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t a = 0; a < NA; ++a) {
        T run = phi_in ? phi_in[(b * H + h) * NA + a] : T(0);
        for (int64_t t = 0; t < len; ++t) {
          const int64_t tok = b * len + t;
          run = wrap_angle(run + dt[tok * H + h] * theta_of(ang[tok * NA + a]));
          phi[(tok * H + h) * NA + a] = run;
        }
        phi_out[(b * H + h) * NA + a] = run;
      }
}

template <class T>
void mamba3_angles_backward(const T* ang, const T* dt, const T* dphi, const T* dphi_out, T* dang, T* ddt,
                            T* dphi_in, int64_t batch, int64_t len, int64_t H, int64_t NA) {
  std::fill_n(dang, batch * len * NA, T(0));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t a = 0; a < NA; ++a) {
        // suffix = sum over t' >= t of dphi_t' (+ dphi_out): the gradient of phi_t's increment
        T suffix = dphi_out ? dphi_out[(b * H + h) * NA + a] : T(0);
        for (int64_t t = len - 1; t >= 0; --t) {
          const int64_t tok = b * len + t;
          suffix += dphi[(tok * H + h) * NA + a];
          const T th = theta_of(ang[tok * NA + a]), tanh_a = th / T(std::numbers::pi);
          ddt[tok * H + h] += suffix * th;
          dang[tok * NA + a] += suffix * dt[tok * H + h] * T(std::numbers::pi) * (T(1) - tanh_a * tanh_a);
        }
        dphi_in[(b * H + h) * NA + a] = suffix;
      }
}

template <class T>
void mamba3_rotary_bc_forward(const T* bc, const T* bias, const T* phi, T* out, int64_t rows, int64_t H,
                              int64_t R, int64_t G, int64_t N, int64_t NA) {
  const int64_t heads_per_group = H / G;
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t h = 0; h < H; ++h) {
      const T* ph = phi + (row * H + h) * NA;
      for (int64_t r = 0; r < R; ++r) {
        const T* src = bc + ((row * R + r) * G + h / heads_per_group) * N;
        const T* bi = bias + (h * R + r) * N;
        T* o = out + ((row * H + h) * R + r) * N;
        for (int64_t n = 0; n < N; ++n) o[n] = src[n] + bi[n];
        for (int64_t j = 0; j < NA; ++j) {
          const T c = std::cos(ph[j]), s = std::sin(ph[j]), p0 = o[2 * j], p1 = o[2 * j + 1];
          o[2 * j] = p0 * c - p1 * s;
          o[2 * j + 1] = p0 * s + p1 * c;
        }
      }
    }
}

template <class T>
void mamba3_rotary_bc_backward(const T* dout, const T* out, const T* phi, T* dbc, T* dbias, T* dphi, int64_t rows,
                               int64_t H, int64_t R, int64_t G, int64_t N, int64_t NA) {
  const int64_t heads_per_group = H / G;
  std::fill_n(dbc, rows * R * G * N, T(0));
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t h = 0; h < H; ++h) {
      const T* ph = phi + (row * H + h) * NA;
      T* dph = dphi + (row * H + h) * NA;
      for (int64_t r = 0; r < R; ++r) {
        const int64_t k = ((row * H + h) * R + r) * N;
        T* dsrc = dbc + ((row * R + r) * G + h / heads_per_group) * N;
        T* dbi = dbias + (h * R + r) * N;
        for (int64_t n = 0; n < N; ++n) {
          T g = dout[k + n];
          if (n < 2 * NA) {  // Rot^T of the output gradient; the angle's gradient from the output
            const int64_t j = n / 2;
            const T c = std::cos(ph[j]), s = std::sin(ph[j]), d0 = dout[k + 2 * j], d1 = dout[k + 2 * j + 1];
            g = n % 2 == 0 ? d0 * c + d1 * s : -d0 * s + d1 * c;
            if (n % 2 == 0) dph[j] += -d0 * out[k + 2 * j + 1] + d1 * out[k + 2 * j];
          }
          dsrc[n] += g;
          dbi[n] += g;
        }
      }
    }
}

template <class T>
void mamba3_expand_x_forward(const T* x, const T* mimo_x, T* X, int64_t rows, int64_t H, int64_t R, int64_t P) {
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t r = 0; r < R; ++r)
        for (int64_t p = 0; p < P; ++p)
          X[((row * H + h) * R + r) * P + p] = x[(row * H + h) * P + p] * at_or_one(mimo_x, (h * R + r) * P + p);
}

template <class T>
void mamba3_expand_x_backward(const T* x, const T* mimo_x, const T* dX, T* dx, T* dmimo_x, int64_t rows, int64_t H,
                              int64_t R, int64_t P) {
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t p = 0; p < P; ++p) {
        const int64_t i = (row * H + h) * P + p;
        T acc = 0;
        for (int64_t r = 0; r < R; ++r) {
          const T g = dX[((row * H + h) * R + r) * P + p];
          acc += g * at_or_one(mimo_x, (h * R + r) * P + p);
          if (mimo_x) dmimo_x[(h * R + r) * P + p] += g * x[i];
        }
        dx[i] = acc;
      }
}

template <class T>
void mamba3_output_gate_forward(const T* y, const T* z, const T* mimo_z, const T* mimo_o, T* out, int64_t rows,
                                int64_t H, int64_t R, int64_t P) {
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t p = 0; p < P; ++p) {
        const int64_t i = (row * H + h) * P + p;
        T acc = 0;
        for (int64_t r = 0; r < R; ++r) {
          const int64_t m = (h * R + r) * P + p;
          acc += y[((row * H + h) * R + r) * P + p] * silu(z[i] * at_or_one(mimo_z, m)) * at_or_one(mimo_o, m);
        }
        out[i] = acc;
      }
}

template <class T>
void mamba3_output_gate_backward(const T* y, const T* z, const T* mimo_z, const T* mimo_o, const T* dout, T* dy,
                                 T* dz, T* dmimo_z, T* dmimo_o, int64_t rows, int64_t H, int64_t R, int64_t P) {
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t p = 0; p < P; ++p) {
        const int64_t i = (row * H + h) * P + p;
        T dz_acc = 0;
        for (int64_t r = 0; r < R; ++r) {
          const int64_t m = (h * R + r) * P + p, k = ((row * H + h) * R + r) * P + p;
          const T mz = at_or_one(mimo_z, m), zr = z[i] * mz, gate = silu(zr);
          const T dgated = dout[i] * at_or_one(mimo_o, m);  // gradient of y * gate
          if (mimo_o) dmimo_o[m] += dout[i] * y[k] * gate;
          dy[k] = dgated * gate;
          const T dzr = dgated * y[k] * silu_grad(zr);
          dz_acc += dzr * mz;
          if (mimo_z) dmimo_z[m] += dzr * z[i];
        }
        dz[i] = dz_acc;
      }
}

#define SF_INSTANTIATE(T)                                                                                        \
  template void mamba3_gates_forward<T>(const T*, const T*, const T*, const T*, T*, T*, T*, int64_t, int64_t,    \
                                        double);                                                                 \
  template void mamba3_gates_backward<T>(const T*, const T*, const T*, const T*, const T*, const T*, const T*,   \
                                         T*, T*, T*, T*, int64_t, int64_t, double);                              \
  template void mamba3_angles_forward<T>(const T*, const T*, const T*, T*, T*, int64_t, int64_t, int64_t,        \
                                         int64_t);                                                               \
  template void mamba3_angles_backward<T>(const T*, const T*, const T*, const T*, T*, T*, T*, int64_t, int64_t,  \
                                          int64_t, int64_t);                                                     \
  template void mamba3_rotary_bc_forward<T>(const T*, const T*, const T*, T*, int64_t, int64_t, int64_t,         \
                                            int64_t, int64_t, int64_t);                                          \
  template void mamba3_rotary_bc_backward<T>(const T*, const T*, const T*, T*, T*, T*, int64_t, int64_t,         \
                                             int64_t, int64_t, int64_t, int64_t);                                \
  template void mamba3_expand_x_forward<T>(const T*, const T*, T*, int64_t, int64_t, int64_t, int64_t);          \
  template void mamba3_expand_x_backward<T>(const T*, const T*, const T*, T*, T*, int64_t, int64_t, int64_t,     \
                                            int64_t);                                                            \
  template void mamba3_output_gate_forward<T>(const T*, const T*, const T*, const T*, T*, int64_t, int64_t,      \
                                              int64_t, int64_t);                                                 \
  template void mamba3_output_gate_backward<T>(const T*, const T*, const T*, const T*, const T*, T*, T*, T*, T*, \
                                               int64_t, int64_t, int64_t, int64_t);
SF_INSTANTIATE(float)
SF_INSTANTIATE(double)
#undef SF_INSTANTIATE

}  // namespace stateflow
