// The NCCL transport in one process on 2 GPUs: a 2-stage pipeline (stage i on GPU i) gives the
// loss and gradients of one stage on GPU 0 with the same chunking: bitwise with 1 microbatch
// (the same kernels on the same rows, each layer accumulating in the same order), within 1e-5
// with 2. A stage that fails before its first send makes the other fail with an Error, well
// within the timeout. Direct sends and receives outside a batch, and the all-reduces, are
// exact. Skipped without 2 GPUs or without NCCL in this build.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "cuda_test_util.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "layer_testing.h"
#include "pipeline/local_transport.h"
#include "pipeline/stage.h"
#include "test_util.h"
#ifdef STATEFLOW_HAVE_NCCL
#include "pipeline/nccl_transport.h"
#endif

namespace stateflow {
namespace {

using testing::fresh_seed;
using testing::random_batch;

#ifdef STATEFLOW_HAVE_NCCL
#define SKIP_WITHOUT_TWO_GPUS()                                                                  \
  do {                                                                                           \
    SKIP_WITHOUT_GPU();                                                                          \
    int n = 0;                                                                                   \
    cudaGetDeviceCount(&n);                                                                      \
    if (n < 2) GTEST_SKIP() << "needs 2 GPUs, found " << n << " (NCCL test skipped)";            \
  } while (0)
#else
#define SKIP_WITHOUT_TWO_GPUS() GTEST_SKIP() << "this build has no NCCL (NCCL test skipped)"
#endif

// Shapes the CUDA kernels support: GDN heads of 128, C = 64, widths multiples of 8.
PipelineConfig two_layer_config(uint64_t seed, int stages, int microbatches) {
  PipelineConfig pc;
  pc.model = testing::gpu_test_model(seed);
  pc.dtype = DType::F32;
  pc.device = Device::CUDA;
  pc.stages = stages;
  pc.microbatches = microbatches;
  pc.chunk_lengths = {64, 64};
  pc.timeout_s = 20;
  return pc;
}

struct StageRuns {
  double loss = 0;
  std::map<std::string, std::vector<float>> grads;  // fp32 master gradients, on the host
  std::vector<std::string> errors;                  // by stage ("" = none)
  double seconds = 0;
};

// Thread per stage on its transport's GPU, as the pipeline runs them; a stage that throws
// aborts its transport (so the others stop) and its message is kept.
StageRuns run_stages(const PipelineConfig& pc, std::vector<std::unique_ptr<Transport>>& endpoints, const Batch& b) {
  StageRuns run;
  run.errors.resize(endpoints.size());
  std::mutex mu;
  const auto t0 = std::chrono::steady_clock::now();
  auto stage = [&](int i) {
    Transport& t = *endpoints[size_t(i)];
    try {
      cuda_check(cudaSetDevice(std::max(t.cuda_device(), 0)), "cudaSetDevice (test stage)");
      Stage s(pc, i, t);
      s.zero_grads();
      const StageStepResult r = s.forward_backward(b);
      std::lock_guard<std::mutex> lock(mu);
      run.loss = r.loss;
      for (Param* p : s.model().params()) {
        Tensor g = p->grad.to(Device::CPU);
        run.grads[p->name].assign(g.data<float>(), g.data<float>() + g.numel());
      }
    } catch (const std::exception& e) {
      t.abort(e.what());
      std::lock_guard<std::mutex> lock(mu);
      run.errors[size_t(i)] = e.what();
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < int(endpoints.size()); ++i) threads.emplace_back(stage, i);
  for (auto& t : threads) t.join();
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return run;
}

StageRuns one_gpu(uint64_t seed, int microbatches, const Batch& b) {
  auto endpoints = make_local_transports(1, 20);
  return run_stages(two_layer_config(seed, 1, microbatches), endpoints, b);
}

#ifdef STATEFLOW_HAVE_NCCL
StageRuns two_gpus(uint64_t seed, int microbatches, const Batch& b) {
  auto endpoints = make_nccl_transports(2, 20);
  EXPECT_EQ(endpoints[0]->cuda_device(), 0);
  EXPECT_EQ(endpoints[1]->cuda_device(), 1);
  return run_stages(two_layer_config(seed, 2, microbatches), endpoints, b);
}

// Normwise: max |a - b| / max |b|.
double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i)
    num = std::max(num, std::abs(double(a[i]) - b[i])), den = std::max(den, std::abs(double(b[i])));
  return den > 0 ? num / den : num;
}

void compare(const StageRuns& got, const StageRuns& ref, bool bitwise) {
  for (const auto& e : got.errors) ASSERT_EQ(e, "");
  for (const auto& e : ref.errors) ASSERT_EQ(e, "");
  ASSERT_EQ(got.grads.size(), ref.grads.size()) << "the stages together must own every parameter once";
  if (bitwise) {
    EXPECT_EQ(std::memcmp(&got.loss, &ref.loss, sizeof(double)), 0) << got.loss << " vs " << ref.loss;
  } else {
    EXPECT_LE(std::abs(got.loss - ref.loss), 1e-5 * std::abs(ref.loss)) << got.loss << " vs " << ref.loss;
  }
  double worst = 0;
  std::string where;
  for (const auto& [name, g] : ref.grads) {
    const std::vector<float>& h = got.grads.at(name);
    ASSERT_EQ(h.size(), g.size()) << name;
    if (bitwise) {
      EXPECT_TRUE(testing::bitwise_equal(h, g)) << name << ": rel diff " << rel_diff(h, g);
    }
    if (const double d = rel_diff(h, g); d >= worst) worst = d, where = name;
  }
  std::printf("[ NCCL 2 GPUs vs 1 GPU ] loss %.9g vs %.9g, worst gradient rel diff %.2e (%s)\n", got.loss, ref.loss,
              worst, where.c_str());
  EXPECT_LE(worst, 1e-5) << where;
}
#endif

#ifdef STATEFLOW_HAVE_NCCL
// The same step on 2 GPUs over NCCL and on one GPU, from fresh weights and a fresh batch.
void two_gpus_against_one(int microbatches, bool bitwise) {
  init_cuda_backend();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const Batch b = random_batch(rng, 2, 128, 512);
  compare(two_gpus(seed, microbatches, b), one_gpu(seed, microbatches, b), bitwise);
}
#endif

TEST(NcclTransportCuda, TwoGpusOneMicrobatchEqualOneGpuBitwise) {
  SKIP_WITHOUT_TWO_GPUS();
#ifdef STATEFLOW_HAVE_NCCL
  two_gpus_against_one(1, /*bitwise=*/true);
#endif
}

TEST(NcclTransportCuda, TwoGpusTwoMicrobatchesMatchOneGpu) {
  SKIP_WITHOUT_TWO_GPUS();
#ifdef STATEFLOW_HAVE_NCCL
  two_gpus_against_one(2, /*bitwise=*/false);
#endif
}

// Direct use, outside a batch: a random tensor sent from GPU 0 arrives bitwise on GPU 1 even
// though the sender dropped it at once and reused its memory (the transport keeps it alive
// until the transfer is done); all-reduces give the exact sum and max of both ranks' values.
TEST(NcclTransportCuda, UnbatchedSendReceiveAndAllReduce) {
  SKIP_WITHOUT_TWO_GPUS();
#ifdef STATEFLOW_HAVE_NCCL
  init_cuda_backend();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const Shape shape{1 + int64_t(rng.below(300)), 1 + int64_t(rng.below(300))};
  Tensor host = Tensor::zeros(shape, DType::F32);
  for (int64_t i = 0; i < host.numel(); ++i) host.data<float>()[i] = float(rng.normal());
  const double values[2] = {rng.normal(), rng.normal()};
  auto endpoints = make_nccl_transports(2, 20);
  const MessageTag tag{Payload::Activation, 0, 0};
  Tensor received;
  double sums[2] = {0, 0}, maxes[2] = {0, 0};
  std::string errors[2];
  auto rank = [&](int r) {
    try {
      cuda_check(cudaSetDevice(r), "cudaSetDevice");
      if (r == 0) {
        endpoints[0]->send(1, tag, host.to(Device::CUDA));  // the only reference is the transport's
        Tensor reuse = host.to(Device::CUDA);                // may get a just-freed block
        cuda_check(cudaMemset(reuse.raw(), 0xff, reuse.nbytes()), "cudaMemset");
      } else {
        received = endpoints[1]->recv(0, tag, {shape, DType::F32, Device::CUDA}).to(Device::CPU);
      }
      sums[r] = endpoints[size_t(r)]->all_reduce_sum(values[r]);
      maxes[r] = endpoints[size_t(r)]->all_reduce_max(values[r]);
      endpoints[size_t(r)]->flush();
    } catch (const std::exception& e) {
      endpoints[size_t(r)]->abort(e.what());
      errors[r] = e.what();
    }
  };
  std::thread t0(rank, 0), t1(rank, 1);
  t0.join(), t1.join();
  ASSERT_EQ(errors[0], "");
  ASSERT_EQ(errors[1], "");
  ASSERT_TRUE(received.defined());
  EXPECT_EQ(std::memcmp(received.raw(), host.raw(), host.nbytes()), 0) << "the message changed on its way";
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(sums[r], values[0] + values[1]);
    EXPECT_EQ(maxes[r], std::max(values[0], values[1]));
  }
#endif
}

#ifdef STATEFLOW_HAVE_NCCL
// Stage 0's transport throws at its first send: stage 1, waiting for that activation, must
// fail with an Error that names stage 0, long before its timeout.
class FailingFirstSend : public Transport {
 public:
  explicit FailingFirstSend(std::unique_ptr<Transport> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string name() const override { return "failing"; }
  int cuda_device() const override { return inner_->cuda_device(); }
  void send(int, const MessageTag& tag, const Tensor&) override { fail("planted failure before sending the ", describe(tag)); }
  Tensor recv(int peer, const MessageTag& tag, const MessageSpec& spec) override { return inner_->recv(peer, tag, spec); }
  void begin_batch() override { inner_->begin_batch(); }
  void end_batch() override { inner_->end_batch(); }
  double all_reduce_sum(double v) override { return inner_->all_reduce_sum(v); }
  double all_reduce_max(double v) override { return inner_->all_reduce_max(v); }
  void flush() override { inner_->flush(); }
  void abort(const std::string& reason) override { inner_->abort(reason); }

 private:
  std::unique_ptr<Transport> inner_;
};
#endif

TEST(NcclTransportCuda, StageThatFailsBeforeSendingStopsTheOther) {
  SKIP_WITHOUT_TWO_GPUS();
#ifdef STATEFLOW_HAVE_NCCL
  init_cuda_backend();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const Batch b = random_batch(rng, 2, 128, 512);
  auto endpoints = make_nccl_transports(2, 20);
  endpoints[0] = std::make_unique<FailingFirstSend>(std::move(endpoints[0]));
  const StageRuns r = run_stages(two_layer_config(seed, 2, 1), endpoints, b);
  std::printf("[ stage 0 fails ] stage 1 stopped after %.2f s: %s\n", r.seconds, r.errors[1].c_str());
  EXPECT_NE(r.errors[0].find("planted failure"), std::string::npos) << r.errors[0];
  EXPECT_NE(r.errors[1].find("stopped because stage 0 failed"), std::string::npos) << r.errors[1];
  EXPECT_LT(r.seconds, 20.0) << "stage 1 should stop when stage 0 aborts, not at its timeout";
#endif
}

}  // namespace
}  // namespace stateflow
