// The scalar-decay recurrence against its closed form, written out as masked attention:
//   o_t = scale * (sum_{s<=t} (prod_{u=s+1..t} a_u) (k_s . q_t) v_s + (prod_{u<=t} a_u) S_in q_t),
// and its leaving state likewise; float64, fresh random inputs.
#include <gtest/gtest.h>

#include <cmath>

#include "mixers/sdecay/sdecay_core.h"
#include "test_util.h"

using namespace stateflow;
using namespace stateflow::testing;

TEST(SdecayCore, RecurrenceEqualsItsClosedForm) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const SdecayDims d{2, 13, 3, 4, 5, 0.5};
  const int64_t rows = d.batch * d.len * d.heads;
  auto q = random_vec<double>(rng, rows * d.dk), k = random_vec<double>(rng, rows * d.dk);
  auto v = random_vec<double>(rng, rows * d.dv), g = random_vec<double>(rng, rows, 0.3);
  for (double& x : g) x = -std::abs(x);
  auto S_in = random_vec<double>(rng, d.batch * d.heads * d.dv * d.dk);
  std::vector<double> o(rows * d.dv), S_out(S_in.size());
  sdecay_forward(d, q.data(), k.data(), v.data(), g.data(), S_in.data(), o.data(), S_out.data());

  std::vector<double> o_ref(o.size()), S_ref(S_out.size());
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads; ++h) {
      auto row = [&](int64_t t) { return (b * d.len + t) * d.heads + h; };
      // decay(s, t) = prod_{u=s+1..t} a_u = exp(sum g)
      auto decay = [&](int64_t s, int64_t t) {
        double sum = 0;
        for (int64_t u = s + 1; u <= t; ++u) sum += g[row(u)];
        return std::exp(sum);
      };
      const double* S0 = &S_in[(b * d.heads + h) * d.dv * d.dk];
      for (int64_t t = 0; t <= d.len; ++t)
        for (int64_t i = 0; i < d.dv; ++i)
          for (int64_t j = 0; j < d.dk; ++j) {
            // the state after token t (t = len: the leaving state, after token len-1)
            const int64_t last = std::min(t, d.len - 1);
            double s_ij = decay(-1, last) * S0[i * d.dk + j];
            for (int64_t s = 0; s <= last; ++s) s_ij += decay(s, last) * v[row(s) * d.dv + i] * k[row(s) * d.dk + j];
            if (t == d.len) S_ref[(b * d.heads + h) * d.dv * d.dk + i * d.dk + j] = s_ij;
            else o_ref[row(t) * d.dv + i] += d.scale * s_ij * q[row(t) * d.dk + j];
          }
    }
  EXPECT_LE(rel_err(o, o_ref), 1e-13);
  EXPECT_LE(rel_err(S_out, S_ref), 1e-13);
}
