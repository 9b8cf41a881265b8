// AdamW and gradient clipping against plain double-precision references of their formulas.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "core/rng.h"
#include "model/param.h"
#include "test_util.h"
#include "model/optimizer.h"

using namespace stateflow;
using stateflow::testing::expect_error;
using stateflow::testing::fresh_seed;

template <class T>
static std::vector<double> values_of(const Tensor& t) {
  const T* p = t.data<T>();
  return std::vector<double>(p, p + t.numel());
}

template <class T>
static void fill_normal(Tensor& t, Rng& rng, double scale = 1.0) {
  T* p = t.data<T>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<T>(scale * rng.normal());
}

// A matrix, a vector and a 3-D tensor: the shapes a model hands the optimizer.
static std::vector<Param> make_params(DType dtype, Rng& rng) {
  std::vector<Param> ps = {make_param("w", {5, 7}, dtype), make_param("norm", {7}, dtype),
                           make_param("conv", {2, 3, 4}, dtype)};
  for (auto& p : ps) dispatch_float(dtype, [&](auto z) { fill_normal<decltype(z)>(p.value, rng); });
  return ps;
}

static std::vector<Param*> pointers(std::vector<Param>& ps) {
  std::vector<Param*> out;
  for (auto& p : ps) out.push_back(&p);
  return out;
}

// The AdamW formulas, element by element, in double.
struct ReferenceAdamW {
  AdamWConfig c;
  std::vector<double> p, m, v;
  bool decay;
  void step(const std::vector<double>& g, double lr, int64_t t) {
    for (size_t i = 0; i < p.size(); ++i) {
      m[i] = c.beta1 * m[i] + (1 - c.beta1) * g[i];
      v[i] = c.beta2 * v[i] + (1 - c.beta2) * g[i] * g[i];
      double m_hat = m[i] / (1 - std::pow(c.beta1, t)), v_hat = v[i] / (1 - std::pow(c.beta2, t));
      if (decay) p[i] -= lr * c.weight_decay * p[i];
      p[i] -= lr * m_hat / (std::sqrt(v_hat) + c.eps);
    }
  }
};

template <class T>
static void check_adamw_matches_reference(double tol) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Rng rng(seed);
  std::vector<Param> ps = make_params(dtype_of<T>(), rng);
  std::vector<Param*> ptrs = pointers(ps);
  AdamWConfig cfg{0.8 + 0.15 * rng.uniform(), 0.9 + 0.09 * rng.uniform(), 1e-8, 0.05 + 0.2 * rng.uniform()};
  AdamW opt(ptrs, cfg);
  std::vector<ReferenceAdamW> refs;
  for (auto& p : ps) {
    std::vector<double> zero(p.value.numel(), 0.0);
    refs.push_back({cfg, values_of<T>(p.value), zero, zero, p.value.ndim() >= 2});
  }
  const int steps = 6;
  for (int s = 1; s <= steps; ++s) {
    double lr = 1e-3 + 1e-2 * rng.uniform();
    for (size_t i = 0; i < ps.size(); ++i) {
      fill_normal<T>(ps[i].grad, rng, 0.1 + rng.uniform());
      refs[i].step(values_of<T>(ps[i].grad), lr, s);
    }
    opt.step(lr);
  }
  EXPECT_EQ(opt.steps(), steps);
  for (size_t i = 0; i < ps.size(); ++i) {
    SCOPED_TRACE(ps[i].name);
    EXPECT_LE(stateflow::testing::rel_err(values_of<T>(ps[i].value), refs[i].p), tol);
    EXPECT_LE(stateflow::testing::rel_err(values_of<T>(opt.exp_avg(i)), refs[i].m), tol);
    EXPECT_LE(stateflow::testing::rel_err(values_of<T>(opt.exp_avg_sq(i)), refs[i].v), tol);
  }
}

TEST(AdamW, MatchesReferenceF64) { check_adamw_matches_reference<double>(1e-13); }
TEST(AdamW, MatchesReferenceF32) { check_adamw_matches_reference<float>(2e-6); }

TEST(AdamW, StateIsOptimizerMemoryInParamDtype) {
  Rng rng(fresh_seed());
  MemoryTracker tracker("test");
  TrackerScope scope(tracker);
  for (DType dtype : {DType::F32, DType::F64}) {
    std::vector<Param> ps = make_params(dtype, rng);
    std::vector<Param*> ptrs = pointers(ps);
    int64_t param_bytes = 0;
    for (auto& p : ps) param_bytes += static_cast<int64_t>(p.value.nbytes());
    int64_t before = tracker.snapshot().current_of(MemCategory::Optimizer);
    AdamW opt(ptrs, AdamWConfig{});
    EXPECT_EQ(tracker.snapshot().current_of(MemCategory::Optimizer) - before, 2 * param_bytes);
    for (size_t i = 0; i < ps.size(); ++i) {
      EXPECT_EQ(opt.exp_avg(i).dtype(), dtype);
      EXPECT_EQ(opt.exp_avg_sq(i).shape(), ps[i].value.shape());
    }
  }
}

// With zero grads the Adam term is 0, so only the decay moves a param: matrices shrink by
// exactly (1 - lr*wd), vectors stay.
TEST(AdamW, WeightDecayOnlyOnMatrices) {
  Rng rng(fresh_seed());
  std::vector<Param> ps = make_params(DType::F64, rng);
  std::vector<Param*> ptrs = pointers(ps);
  std::vector<std::vector<double>> before;
  for (auto& p : ps) before.push_back(values_of<double>(p.value));
  AdamW opt(ptrs, AdamWConfig{0.9, 0.95, 1e-8, 0.1});
  opt.step(0.5);
  for (size_t i = 0; i < ps.size(); ++i) {
    double factor = ps[i].value.ndim() >= 2 ? 1 - 0.5 * 0.1 : 1.0;
    EXPECT_EQ(takes_weight_decay(ps[i]), ps[i].value.ndim() >= 2);
    std::vector<double> after = values_of<double>(ps[i].value);
    for (size_t j = 0; j < after.size(); ++j) EXPECT_DOUBLE_EQ(after[j], before[i][j] * factor) << ps[i].name;
  }
}

// Copying m, v and the step count into a fresh optimizer continues the run bit for bit.
TEST(AdamW, RestoredStateContinuesIdentically) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Rng rng(seed);
  std::vector<Param> a = make_params(DType::F32, rng);
  std::vector<Param*> pa = pointers(a);
  AdamW opt_a(pa, AdamWConfig{});
  for (int s = 0; s < 3; ++s) {
    for (auto& p : a) fill_normal<float>(p.grad, rng);
    opt_a.step(1e-2);
  }
  std::vector<Param> b;
  for (auto& p : a) b.push_back(Param{p.name, p.value.clone(), p.grad.clone()});
  std::vector<Param*> pb = pointers(b);
  AdamW opt_b(pb, AdamWConfig{});
  for (size_t i = 0; i < a.size(); ++i) {
    opt_b.exp_avg(i).copy_from(opt_a.exp_avg(i));
    opt_b.exp_avg_sq(i).copy_from(opt_a.exp_avg_sq(i));
  }
  opt_b.set_steps(opt_a.steps());
  for (int s = 0; s < 2; ++s) {
    for (size_t i = 0; i < a.size(); ++i) {
      fill_normal<float>(a[i].grad, rng);
      b[i].grad.copy_from(a[i].grad);
    }
    opt_a.step(3e-3);
    opt_b.step(3e-3);
  }
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(max_rel_diff(b[i].value, a[i].value), 0.0) << a[i].name;
}

TEST(AdamW, RejectsBadConfigAndParams) {
  Rng rng(fresh_seed());
  std::vector<Param> ps = make_params(DType::F32, rng);
  std::vector<Param*> ptrs = pointers(ps);
  expect_error([&] { AdamW(ptrs, AdamWConfig{1.0, 0.95, 1e-8, 0.1}); }, "beta1");
  expect_error([&] { AdamW(ptrs, AdamWConfig{0.9, -0.1, 1e-8, 0.1}); }, "beta2");
  expect_error([&] { AdamW(ptrs, AdamWConfig{0.9, 0.95, 0, 0.1}); }, "eps");
  expect_error([&] { AdamW(ptrs, AdamWConfig{0.9, 0.95, 1e-8, -1}); }, "weight_decay");
  expect_error([&] { AdamW({ptrs[0], ptrs[0]}, AdamWConfig{}); }, "twice");
  Param bad{"bad", Tensor::zeros({3, 4}, DType::F32), Tensor::zeros({4, 3}, DType::F32)};
  expect_error([&] { AdamW({&bad}, AdamWConfig{}); }, "bad");
  AdamW opt(ptrs, AdamWConfig{});
  expect_error([&] { opt.step(-1e-3); }, "learning rate");
  expect_error([&] { opt.set_steps(-1); }, "step count");
}

template <class T>
static void check_clip(double tol) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Rng rng(seed);
  std::vector<Param> ps = make_params(dtype_of<T>(), rng);
  std::vector<Param*> ptrs = pointers(ps);
  std::vector<std::vector<double>> grads;
  double sq = 0;
  for (auto& p : ps) {
    fill_normal<T>(p.grad, rng);
    grads.push_back(values_of<T>(p.grad));
    for (double g : grads.back()) sq += g * g;
  }
  const double norm = std::sqrt(sq);

  // Above the norm, or disabled: grads untouched.
  for (double max_norm : {2 * norm, 0.0, -1.0}) {
    EXPECT_NEAR(clip_grad_norm(ptrs, max_norm), norm, 1e-12 * norm);
    for (size_t i = 0; i < ps.size(); ++i) EXPECT_EQ(values_of<T>(ps[i].grad), grads[i]) << "max_norm " << max_norm;
  }
  // Below the norm: same direction, new norm = max_norm.
  const double max_norm = norm * (0.1 + 0.8 * rng.uniform());
  EXPECT_NEAR(clip_grad_norm(ptrs, max_norm), norm, 1e-12 * norm);
  EXPECT_NEAR(std::sqrt(grad_sq_sum(ptrs)), max_norm, tol * max_norm);
  for (size_t i = 0; i < ps.size(); ++i) {
    std::vector<double> expected = grads[i];
    for (double& g : expected) g *= max_norm / norm;
    EXPECT_LE(stateflow::testing::rel_err(values_of<T>(ps[i].grad), expected), tol);
  }
  zero_grads(ptrs);
  EXPECT_EQ(grad_sq_sum(ptrs), 0.0);
}

TEST(ClipGradNorm, F64) { check_clip<double>(1e-14); }
TEST(ClipGradNorm, F32) { check_clip<float>(1e-6); }

TEST(ClipGradNorm, NonFiniteNormLeavesGrads) {
  std::vector<Param> ps = {make_param("w", {2, 2}, DType::F64)};
  std::vector<Param*> ptrs = pointers(ps);
  ps[0].grad.data<double>()[0] = INFINITY;
  ps[0].grad.data<double>()[1] = 3.0;
  EXPECT_TRUE(std::isinf(clip_grad_norm(ptrs, 1.0)));
  EXPECT_EQ(ps[0].grad.data<double>()[1], 3.0);
}
