#include "core/rng.h"

#include <cmath>

#include "core/error.h"

namespace stateflow {

static uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

Rng::Rng(uint64_t seed) {
  for (auto& w : s_) w = splitmix64(seed);
}

Rng Rng::derive(uint64_t seed, uint64_t stream) {
  uint64_t x = seed ^ (0xD1B54A32D192ED03ull * (stream + 1));
  return Rng(splitmix64(x));
}

uint64_t Rng::next_u64() {
  uint64_t r = rotl(s_[1] * 5, 7) * 9;
  uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return r;
}

double Rng::uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
double Rng::uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }

double Rng::normal() {
  double u1 = uniform();
  double u2 = uniform();
  if (u1 < 1e-300) u1 = 1e-300;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// Jumping ahead. The generator's step is linear over GF(2) on its 256 state bits, and its
// characteristic polynomial P has degree 256, so by Cayley-Hamilton the state after d steps is
// J(step) applied to the state, J = x^d mod P: a sum of the states after 0..255 steps.
namespace {

using Poly = std::array<uint64_t, 4>;  // GF(2) polynomial of degree < 256, bit i = coefficient of x^i

bool coefficient(const Poly& p, int i) { return (p[i / 64] >> (i % 64)) & 1; }

// P without its leading x^256 term, found once by Berlekamp-Massey from 512 steps of one
// state bit (a linear sequence whose minimal polynomial is P for a full-period generator).
const Poly& characteristic_low_terms() {
  static const Poly low = [] {
    constexpr int N = 512;
    Rng r(1);
    std::array<uint8_t, N> bits;
    for (int n = 0; n < N; ++n) r.next_u64(), bits[n] = r.state()[0] & 1;
    std::array<uint8_t, N + 1> c{}, b{};  // connection polynomials: bits[n] = sum c[i] bits[n - i]
    c[0] = b[0] = 1;
    int L = 0, m = 1;
    for (int n = 0; n < N; ++n) {
      uint8_t d = bits[n];
      for (int i = 1; i <= L; ++i) d ^= c[i] & bits[n - i];
      if (!d) {
        ++m;
        continue;
      }
      const auto before = c;
      for (int i = 0; i + m <= N; ++i) c[i + m] ^= b[i];
      if (2 * L <= n) L = n + 1 - L, b = before, m = 1;
      else ++m;
    }
    SF_CHECK(L == 256, "Rng: the generator's characteristic polynomial has degree ", L, ", not 256");
    Poly p{};  // P(x) = x^256 + sum_{i=1..256} c[i] x^(256-i)
    for (int i = 1; i <= 256; ++i)
      if (c[i]) p[(256 - i) / 64] |= uint64_t(1) << ((256 - i) % 64);
    return p;
  }();
  return low;
}

// a * x mod P.
Poly times_x(Poly a) {
  const bool overflow = a[3] >> 63;
  for (int w = 3; w > 0; --w) a[w] = (a[w] << 1) | (a[w - 1] >> 63);
  a[0] <<= 1;
  if (overflow)
    for (int w = 0; w < 4; ++w) a[w] ^= characteristic_low_terms()[w];
  return a;
}

// a * b mod P (Horner over b's coefficients).
Poly times(const Poly& a, const Poly& b) {
  Poly r{};
  for (int i = 255; i >= 0; --i) {
    r = times_x(r);
    if (coefficient(b, i))
      for (int w = 0; w < 4; ++w) r[w] ^= a[w];
  }
  return r;
}

}  // namespace

void Rng::advance(uint64_t draws) {
  Poly jump{1, 0, 0, 0}, power{2, 0, 0, 0};  // x^0 and x^(2^k) mod P
  for (uint64_t d = draws; d; d >>= 1) {
    if (d & 1) jump = times(jump, power);
    if (d > 1) power = times(power, power);
  }
  std::array<uint64_t, 4> sum{};
  for (int j = 0; j < 256; ++j) {
    if (coefficient(jump, j))
      for (int w = 0; w < 4; ++w) sum[w] ^= s_[w];
    next_u64();
  }
  s_ = sum;
}

uint64_t Rng::below(uint64_t n) {
  uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do x = next_u64();
  while (x >= limit);
  return x % n;
}

}  // namespace stateflow
