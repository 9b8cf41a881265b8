// Checkpoints of GPU runs: a GPU run saved and resumed on the GPU continues bitwise as an
// unbroken GPU run (losses, fp32 masters, AdamW moments, bf16 GEMM copies); a checkpoint
// written on the GPU loads on the CPU with the same weights and moments, and one written on
// the CPU in f32 loads on the GPU, its bf16 copies re-cast from the loaded masters; an f64
// CPU checkpoint is refused on the GPU, naming the fix.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <sstream>

#include "cuda_test_util.h"
#include "kernels/cuda/cuda_backend.h"
#include "temp_dir.h"
#include "test_util.h"
#include "train/trainer.h"

namespace stateflow {
namespace {

using testing::fresh_seed;
using testing::TempDir;

// A model the CUDA kernels run (GDN heads of 128, sub-chunks of 64), a few steps of recall.
TrainOptions gpu_options(Rng& rng) {
  TrainOptions o;
  o.model = testing::gpu_test_model(rng.next_u64());
  o.data.seed = rng.next_u64();
  o.device = Device::CUDA;
  o.steps = 5, o.batch = 2, o.seq_len = 128;
  o.stages = 1, o.microbatches = 1, o.chunks = 2;
  o.warmup = 2, o.log_every = 1000;
  return o;
}

std::vector<double> losses_of(const std::vector<StepReport>& r) {
  std::vector<double> out;
  for (const StepReport& s : r) out.push_back(s.loss);
  return out;
}

// p's bf16 GEMM copy on the host, of p's own shape (its columns where the copy is shared with
// its group's, model/param.h).
Tensor bf16_copy_on_host(const Param& p) {
  const Tensor all = p.value_bf16.to(Device::CPU);
  if (p.bf16_ld == 0) return all;
  Tensor own = Tensor::zeros(p.value.shape(), DType::BF16, MemCategory::Other);
  const int64_t rows = p.value.dim(0), cols = p.value.dim(1);
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(own.data<BF16>() + r * cols, all.data<BF16>() + r * p.bf16_ld + p.bf16_col, size_t(cols) * sizeof(BF16));
  return own;
}

// name -> host copies of (value, m, v, bf16 GEMM copy if any) of every parameter.
std::map<std::string, std::vector<Tensor>> host_state(Trainer& t) {
  std::map<std::string, std::vector<Tensor>> out;
  for (Stage* s : t.pipeline().stages()) {
    AdamW& opt = s->optimizer();
    for (size_t i = 0; i < opt.params().size(); ++i) {
      const Param& p = *opt.params()[i];
      auto& v = out[p.name];
      v = {p.value.to(Device::CPU), opt.exp_avg(i).to(Device::CPU), opt.exp_avg_sq(i).to(Device::CPU)};
      if (p.value_bf16.defined()) v.push_back(bf16_copy_on_host(p));
    }
  }
  return out;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// The first `tensors` of every parameter (3: value, m, v; 4: and the bf16 copy where there is
// one) bitwise the same in `got` as in `want`.
void expect_same_state(const std::map<std::string, std::vector<Tensor>>& got,
                       const std::map<std::string, std::vector<Tensor>>& want, size_t tensors) {
  ASSERT_EQ(got.size(), want.size());
  const char* what[] = {"value", "exp_avg", "exp_avg_sq", "value_bf16"};
  for (const auto& [name, w] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    const auto& g = got.at(name);
    const size_t n = std::min(tensors, w.size());
    ASSERT_GE(g.size(), n) << name;
    for (size_t k = 0; k < n; ++k) EXPECT_TRUE(bitwise_equal(g[k], w[k])) << name << " " << what[k];
  }
}

int64_t optimizer_steps(Trainer& t) { return t.pipeline().stages().front()->optimizer().steps(); }

TEST(CheckpointCuda, GpuResumeContinuesBitwiseAsAnUnbrokenGpuRun) {
  SKIP_WITHOUT_GPU();
  init_cuda_backend();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  TempDir dir;
  const TrainOptions o = gpu_options(rng);
  std::ostringstream quiet;
  Trainer unbroken(o);
  const std::vector<double> want = losses_of(unbroken.run(quiet));

  TrainOptions first = o;
  first.save_dir = dir.path.string();
  Trainer a(first);
  std::vector<double> got;
  for (int i = 0; i < 2; ++i) got.push_back(a.step().loss);
  a.save_checkpoint();

  TrainOptions second = o;
  second.resume = dir.path.string();
  Trainer b(second);
  EXPECT_EQ(b.steps_done(), 2);
  EXPECT_EQ(optimizer_steps(b), 2);
  for (double l : losses_of(b.run(quiet))) got.push_back(l);
  EXPECT_EQ(got, want);  // bitwise
  expect_same_state(host_state(b), host_state(unbroken), 4);
}

TEST(CheckpointCuda, GpuCheckpointLoadsOnTheCpuWithTheSameWeights) {
  SKIP_WITHOUT_GPU();
  init_cuda_backend();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  TempDir dir;
  TrainOptions o = gpu_options(rng);
  o.save_dir = dir.path.string();
  Trainer gpu(o);
  for (int i = 0; i < 2; ++i) gpu.step();
  gpu.save_checkpoint();

  TrainOptions on_cpu = o;
  on_cpu.device = Device::CPU;
  on_cpu.stages = 2, on_cpu.microbatches = 2;  // another split loads it too
  on_cpu.resume = dir.path.string();
  Trainer cpu(on_cpu);
  EXPECT_EQ(cpu.steps_done(), 2);
  EXPECT_EQ(optimizer_steps(cpu), 2);
  expect_same_state(host_state(cpu), host_state(gpu), 3);
}

TEST(CheckpointCuda, CpuCheckpointLoadsOnTheGpuWithBf16CopiesOfTheMasters) {
  SKIP_WITHOUT_GPU();
  init_cuda_backend();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  TempDir dir;
  TrainOptions o = gpu_options(rng);
  o.device = Device::CPU;
  o.save_dir = dir.path.string();
  Trainer cpu(o);
  cpu.step();  // moments and weights no longer at their initial values
  cpu.save_checkpoint();

  TrainOptions on_gpu = o;
  on_gpu.device = Device::CUDA;
  on_gpu.resume = dir.path.string();
  Trainer gpu(on_gpu);
  EXPECT_EQ(gpu.steps_done(), 1);
  const auto loaded = host_state(gpu);
  expect_same_state(loaded, host_state(cpu), 3);
  size_t copies = 0;
  for (const auto& [name, t] : loaded) {
    if (t.size() < 4) continue;
    ++copies;
    EXPECT_TRUE(bitwise_equal(t[3], t[0].cast(DType::BF16))) << name;
  }
  EXPECT_GT(copies, 0u) << "the GEMM weights have bf16 copies on the GPU";
  // And it trains on from there.
  const StepReport r = gpu.step();
  EXPECT_TRUE(std::isfinite(r.loss)) << r.loss;
}

TEST(CheckpointCuda, F64CheckpointIsRefusedOnTheGpuNamingTheFix) {
  SKIP_WITHOUT_GPU();
  init_cuda_backend();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  TempDir dir;
  TrainOptions o = gpu_options(rng);
  o.device = Device::CPU, o.dtype = DType::F64;
  o.save_dir = dir.path.string();
  Trainer(o).save_checkpoint();

  o.device = Device::CUDA, o.dtype = DType::F32;
  o.resume = dir.path.string();
  testing::expect_error([&] { Trainer t(o); }, "resume it on the CPU (--device cpu)");
}

}  // namespace
}  // namespace stateflow
