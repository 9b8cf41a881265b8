// In-process transport: one thread per stage, messages handed over through a shared hub.
// A received tensor is checked against the receiver's MessageSpec and copied into the
// receiver's own memory (its tracker), as a real transfer would, so per-stage memory
// accounting stays honest. Stages whose device work is queued apart (SM partitions: each
// stage thread's own queue) hand device tensors over only once the sender's work on them is
// done, and the receiver lets go of the sender's tensor only once its copy is done.
#pragma once
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "pipeline/transport.h"

namespace stateflow {

class LocalHub {
 public:
  LocalHub(int world_size, double timeout_s, bool device_queues_apart = false);
  int world_size() const { return world_size_; }
  double timeout_s() const { return timeout_s_; }

 private:
  friend class LocalTransport;
  int world_size_;
  double timeout_s_;
  bool device_queues_apart_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::tuple<int, int, MessageTag>, Tensor> mailbox_;  // (src, dst, tag)
  std::string failure_;                                          // set by abort()
  // all-reduce rendezvous; contributions are summed in rank order, whatever order they
  // arrive in, so that a run's results repeat bit for bit (exact resume relies on it)
  int64_t generation_ = 0;
  int arrived_ = 0;
  std::vector<double> contributions_;
  double result_sum_ = 0, result_max_ = 0;
};

class LocalTransport : public Transport {
 public:
  LocalTransport(std::shared_ptr<LocalHub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return hub_->world_size(); }
  std::string name() const override { return "local"; }
  void send(int peer, const MessageTag& tag, const Tensor& t) override;
  Tensor recv(int peer, const MessageTag& tag, const MessageSpec& spec) override;
  double all_reduce_sum(double value) override;
  double all_reduce_max(double value) override;
  void flush() override {}
  void abort(const std::string& reason) override;

 private:
  // Both reductions at once: every rank contributes (sum, max) and gets both results.
  std::pair<double, double> all_reduce(double value);
  void check_failure_locked() const;
  std::shared_ptr<LocalHub> hub_;
  int rank_;
};

// P endpoints sharing one hub; device_queues_apart: the stages' device work is queued apart
// (PipelineConfig::split_sms).
std::vector<std::unique_ptr<Transport>> make_local_transports(int world_size, double timeout_s,
                                                              bool device_queues_apart = false);

}  // namespace stateflow
