// The pipeline's stage threads: each local stage keeps one thread for the pipeline's lifetime
// (built, run and destroyed there, across steps, norms and updates; a lone stage keeps the
// caller's, as MPI needs), and a failure on one stage still ends the step on every stage
// with the root-cause error.
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <set>
#include <thread>

#include "layer_testing.h"
#include "pipeline/local_transport.h"
#include "pipeline/pipeline.h"
#include "test_util.h"

using namespace stateflow;
using namespace stateflow::testing;

namespace {

// Which threads called into each rank's transport.
struct ThreadLog {
  std::mutex mu;
  std::map<int, std::set<std::thread::id>> by_rank;
  void record(int rank) {
    std::lock_guard<std::mutex> lock(mu);
    by_rank[rank].insert(std::this_thread::get_id());
  }
};

// A local transport that logs the calling thread of every call a stage makes, and that fails
// its receives once told to.
class LoggingTransport : public LocalTransport {
 public:
  LoggingTransport(std::shared_ptr<LocalHub> hub, int rank, ThreadLog& log) : LocalTransport(std::move(hub), rank), log_(log) {}
  int world_size() const override {
    log_.record(rank());
    return LocalTransport::world_size();
  }
  void send(int peer, const MessageTag& tag, const Tensor& t) override {
    log_.record(rank());
    LocalTransport::send(peer, tag, t);
  }
  Tensor recv(int peer, const MessageTag& tag, const MessageSpec& spec) override {
    log_.record(rank());
    if (fail_receives) fail("injected receive failure on stage ", rank());
    return LocalTransport::recv(peer, tag, spec);
  }
  double all_reduce_sum(double v) override {
    log_.record(rank());
    return LocalTransport::all_reduce_sum(v);
  }
  bool fail_receives = false;

 private:
  ThreadLog& log_;
};

PipelineConfig small_config(int stages) {
  PipelineConfig pc;
  pc.model = model_preset("tiny");
  pc.stages = stages, pc.microbatches = 1, pc.chunk_lengths = {4, 4};
  return pc;
}

std::vector<std::unique_ptr<Transport>> logging_transports(int P, double timeout_s, ThreadLog& log,
                                                           std::vector<LoggingTransport*>& out) {
  auto hub = std::make_shared<LocalHub>(P, timeout_s);
  std::vector<std::unique_ptr<Transport>> endpoints;
  for (int r = 0; r < P; ++r) {
    auto t = std::make_unique<LoggingTransport>(hub, r, log);
    out.push_back(t.get());
    endpoints.push_back(std::move(t));
  }
  return endpoints;
}

}  // namespace

TEST(PipelineThreads, EachStageRunsOnOneThreadOfItsOwnAcrossSteps) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (int P : {1, 2}) {
    SCOPED_TRACE("P=" + std::to_string(P));
    ThreadLog log;
    std::vector<LoggingTransport*> raw;
    PipelineConfig pc = small_config(P);
    {
      Pipeline pipe(pc, logging_transports(P, 30.0, log, raw));
      for (int step = 0; step < 3; ++step) {
        pipe.zero_grads();
        pipe.forward_backward(random_batch(rng, 1, 8, pc.model.vocab_size));
        pipe.clip_and_update(1e-3, pipe.grad_norm());
      }
    }
    std::set<std::thread::id> all;
    for (int r = 0; r < P; ++r) {
      const std::set<std::thread::id>& ids = log.by_rank[r];
      ASSERT_EQ(ids.size(), 1u) << "stage " << r << " was built and run on " << ids.size() << " threads";
      all.insert(*ids.begin());
    }
    if (P == 1) {
      EXPECT_EQ(*all.begin(), std::this_thread::get_id()) << "a lone stage (MPI) runs on the caller's thread";
    } else {
      EXPECT_EQ(int(all.size()), P) << "every stage has a thread of its own";
      EXPECT_FALSE(all.count(std::this_thread::get_id())) << "a stage ran on the caller's thread";
    }
  }
}

TEST(PipelineThreads, AFailedStageAbortsItsPeersAndTheFirstErrorWins) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  ThreadLog log;
  std::vector<LoggingTransport*> raw;
  PipelineConfig pc = small_config(2);
  pc.timeout_s = 30.0;  // only the abort can end stage 0's wait in time
  Pipeline pipe(pc, logging_transports(2, pc.timeout_s, log, raw));
  pipe.forward_backward(random_batch(rng, 1, 8, pc.model.vocab_size));  // a good step first
  raw[1]->fail_receives = true;
  const auto t0 = std::chrono::steady_clock::now();
  expect_error([&] { pipe.forward_backward(random_batch(rng, 1, 8, pc.model.vocab_size)); },
               "injected receive failure on stage 1");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0)
      << "stage 0 kept waiting for its failed peer";
  // The threads survive a failed step: the next job runs (and fails fast on the aborted transport).
  EXPECT_THROW(pipe.forward_backward(random_batch(rng, 1, 8, pc.model.vocab_size)), Error);
}

TEST(PipelineThreads, AStagePlacedOnAGpuNeedsTheCudaDevice) {
  // The local transport, placing stage i on GPU i as the NCCL transport does.
  struct PlacedTransport : LocalTransport {
    using LocalTransport::LocalTransport;
    int cuda_device() const override { return rank(); }
  };
  PipelineConfig pc = small_config(2);  // device cpu
  auto hub = std::make_shared<LocalHub>(2, 5.0);
  std::vector<std::unique_ptr<Transport>> endpoints;
  for (int r = 0; r < 2; ++r) endpoints.push_back(std::make_unique<PlacedTransport>(hub, r));
  hub.reset();
  expect_error([&] { Pipeline pipe(pc, std::move(endpoints)); }, ": use --device cuda");
}
