#include "pipeline/local_transport.h"

#include <algorithm>
#include <chrono>

#include "model/device_ops.h"

namespace stateflow {

LocalHub::LocalHub(int world_size, double timeout_s, bool device_queues_apart)
    : world_size_(world_size), timeout_s_(timeout_s), device_queues_apart_(device_queues_apart) {
  SF_CHECK(world_size >= 1, "local transport needs at least one stage");
  SF_CHECK(timeout_s > 0, "transport timeout must be positive, got ", timeout_s);
  contributions_.resize(world_size);
}

void LocalTransport::check_failure_locked() const {
  if (!hub_->failure_.empty()) fail("stage ", rank_, " stopped because ", hub_->failure_);
}

void LocalTransport::send(int peer, const MessageTag& tag, const Tensor& t) {
  SF_CHECK(peer >= 0 && peer < world_size() && peer != rank_, "stage ", rank_, ": bad peer ", peer);
  if (hub_->device_queues_apart_ && t.device() != Device::CPU) synchronize_gpu_thread();
  std::lock_guard<std::mutex> lock(hub_->mu_);
  check_failure_locked();
  auto [it, fresh] = hub_->mailbox_.emplace(std::make_tuple(rank_, peer, tag), t);
  SF_CHECK(fresh, "stage ", rank_, " sent ", describe(tag), " to stage ", peer, " twice");
  hub_->cv_.notify_all();
}

Tensor LocalTransport::recv(int peer, const MessageTag& tag, const MessageSpec& spec) {
  std::unique_lock<std::mutex> lock(hub_->mu_);
  auto key = std::make_tuple(peer, rank_, tag);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(hub_->timeout_s());
  while (true) {
    check_failure_locked();
    auto it = hub_->mailbox_.find(key);
    if (it != hub_->mailbox_.end()) {
      Tensor sent = std::move(it->second);
      hub_->mailbox_.erase(it);
      lock.unlock();
      check_arrival(sent, spec, peer, tag);
      Tensor own = sent.clone();  // now owned (and counted) by the receiving stage
      // The sender's block may be reused as soon as `sent` goes: not before the copy is done.
      if (hub_->device_queues_apart_ && own.device() != Device::CPU) synchronize_gpu_thread();
      return own;
    }
    if (hub_->cv_.wait_until(lock, deadline) == std::cv_status::timeout && !hub_->mailbox_.count(key)) {
      check_failure_locked();
      fail("stage ", rank_, " waited ", hub_->timeout_s(), " s for the ", describe(tag), " from stage ", peer,
           ", which stalled or died; raise --timeout if its steps are legitimately that slow");
    }
  }
}

std::pair<double, double> LocalTransport::all_reduce(double value) {
  std::unique_lock<std::mutex> lock(hub_->mu_);
  check_failure_locked();
  LocalHub& h = *hub_;
  const int64_t gen = h.generation_;
  h.contributions_[rank_] = value;
  if (++h.arrived_ == h.world_size_) {
    h.result_sum_ = h.result_max_ = h.contributions_[0];
    for (int r = 1; r < h.world_size_; ++r)
      h.result_sum_ += h.contributions_[r], h.result_max_ = std::max(h.result_max_, h.contributions_[r]);
    h.arrived_ = 0;
    ++h.generation_;
    h.cv_.notify_all();
    return {h.result_sum_, h.result_max_};
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(h.timeout_s());
  while (h.generation_ == gen) {
    check_failure_locked();
    if (h.cv_.wait_until(lock, deadline) == std::cv_status::timeout && h.generation_ == gen)
      fail("stage ", rank_, " waited ", h.timeout_s(), " s in an all-reduce for ", h.world_size_ - h.arrived_,
           " other stage(s), which stalled or died");
  }
  return {h.result_sum_, h.result_max_};
}

double LocalTransport::all_reduce_sum(double value) { return all_reduce(value).first; }
double LocalTransport::all_reduce_max(double value) { return all_reduce(value).second; }

void LocalTransport::abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(hub_->mu_);
  if (hub_->failure_.empty()) hub_->failure_ = cat("stage ", rank_, " failed: ", reason);
  hub_->cv_.notify_all();
}

std::vector<std::unique_ptr<Transport>> make_local_transports(int world_size, double timeout_s,
                                                              bool device_queues_apart) {
  auto hub = std::make_shared<LocalHub>(world_size, timeout_s, device_queues_apart);
  std::vector<std::unique_ptr<Transport>> out;
  for (int r = 0; r < world_size; ++r) out.push_back(std::make_unique<LocalTransport>(hub, r));
  return out;
}

}  // namespace stateflow
