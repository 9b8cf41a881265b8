// The formulas an op's inputs are drawn with (OpDef's Fill), compiled for the host (tests,
// draw_inputs) and the device (benchmarks, OpBuffers::draw): a counter-based generator, so
// element i depends only on (seed, i) and a large array fills in parallel. Arithmetic in
// double on both sides; the host and device values agree to the last bits of a double, so
// after rounding to f32 or bf16 they agree except, rarely, by one unit in the last place.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/op_def.h"

#ifdef __CUDACC__
#define SF_HOST_DEVICE __host__ __device__
#else
#define SF_HOST_DEVICE
#endif

namespace stateflow::op_inputs {

// splitmix64 of (seed, i): 64 random bits.
SF_HOST_DEVICE inline uint64_t bits_at(uint64_t seed, uint64_t i) {
  uint64_t z = i * 0x9E3779B97F4A7C15ull + seed * 0xD1B54A32D192ED03ull + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in (0, 1), 53 bits.
SF_HOST_DEVICE inline double uniform_at(uint64_t seed, uint64_t i) {
  return (double(bits_at(seed, i) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

// Standard normal (Box-Muller on two uniforms).
SF_HOST_DEVICE inline double normal_at(uint64_t seed, uint64_t i) {
  return sqrt(-2.0 * log(uniform_at(seed, 2 * i))) * cos(6.283185307179586 * uniform_at(seed, 2 * i + 1));
}

// 1 / |row| for UnitRows (rows of `width` normals).
SF_HOST_DEVICE inline double inv_row_norm(uint64_t seed, uint64_t row, int64_t width) {
  double n2 = 0;
  for (int64_t j = 0; j < width; ++j) {
    const double x = normal_at(seed, row * uint64_t(width) + uint64_t(j));
    n2 += x * x;
  }
  return 1.0 / sqrt(n2 + 1e-6);
}

// Element i of an array drawn with f (UnitRows: inv_norm is its row's inv_row_norm).
SF_HOST_DEVICE inline double fill_value(const Fill& f, uint64_t seed, int64_t i, double inv_norm = 1.0) {
  const uint64_t u = uint64_t(i);
  switch (f.kind) {
    case Fill::Kind::Normal: return f.a + f.b * normal_at(seed, u);
    case Fill::Kind::Uniform: return f.a + (f.b - f.a) * uniform_at(seed, u);
    case Fill::Kind::UnitRows: return normal_at(seed, u) * inv_norm;
    case Fill::Kind::Sigmoid: return 1.0 / (1.0 + exp(-normal_at(seed, u)));
    case Fill::Kind::LogDecay: {
      // Per-head A and dt from their own streams of the same seed (index = the head).
      const uint64_t h = u % uint64_t(f.width);
      const double A = 1.0 + 15.0 * uniform_at(seed ^ 0xA11CEull, h);
      const double dt = 0.001 + 0.099 * uniform_at(seed ^ 0xD7ull, h);
      const double x = normal_at(seed, u) + log(expm1(dt));
      return -A * (x > 20 ? x : log1p(exp(x)));
    }
    case Fill::Kind::Ids: return double(bits_at(seed, u) % uint64_t(f.width));
  }
  return 0;
}

}  // namespace stateflow::op_inputs
