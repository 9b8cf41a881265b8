#include "pipeline/pipeline.h"

#include <condition_variable>
#include <exception>
#include <mutex>
#include <new>
#include <thread>

#include "kernels/cpu/gemm.h"
#include "pipeline/local_transport.h"

namespace stateflow {

// A thread that runs one stage's jobs, one at a time, until it is destroyed.
class StageThread {
 public:
  StageThread() : thread_([this] { loop(); }) {}
  ~StageThread() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  // Hands the thread a job, which must not throw, and returns at once.
  void start(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = std::move(job);
    }
    cv_.notify_all();
  }
  // Returns when the job handed over last is done.
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !job_; });
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return job_ || stop_; });
      if (!job_) return;
      lock.unlock();
      job_();  // nobody else changes job_ until it is cleared
      lock.lock();
      job_ = nullptr;
      cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;
  bool stop_ = false;
  std::thread thread_;  // last: starts once the members it uses exist
};

Pipeline::Pipeline(const PipelineConfig& cfg, std::vector<std::unique_ptr<Transport>> endpoints,
                   std::unique_ptr<Transport> group)
    : cfg_(cfg), endpoints_(std::move(endpoints)), group_(std::move(group)) {
  SF_CHECK(!endpoints_.empty(), "a pipeline needs at least one stage to run");
  SF_CHECK(!group_ || endpoints_.size() == 1, "data parallelism runs one stage per process");
  if (endpoints_.size() > 1) set_blas_threads(1);
  stages_.resize(endpoints_.size());
  // A lone stage that the transport does not place on a GPU stays on the caller's thread:
  // MPI, initialised FUNNELED, must be called from the main thread.
  if (endpoints_.size() > 1 || endpoints_[0]->cuda_device() >= 0)
    for (size_t i = 0; i < endpoints_.size(); ++i) threads_.push_back(std::make_unique<StageThread>());
  try {
    run_all([&](int i) {
      stages_[i] = std::make_unique<Stage>(cfg_, endpoints_[i]->rank(), *endpoints_[i], group_.get());
    });
  } catch (...) {
    destroy_stages();  // those that were built
    throw;
  }
}

Pipeline::~Pipeline() { destroy_stages(); }

void Pipeline::destroy_stages() {
  // The endpoints first: messages a failed step left there hold memory charged to a stage's
  // tracker. Then each stage goes on its own thread, which drives its GPU (a stage on the
  // caller's thread goes with stages_).
  endpoints_.clear();
  group_.reset();
  for (size_t i = 0; i < threads_.size(); ++i) threads_[i]->start([this, i] { stages_[i].reset(); });
  for (auto& t : threads_) t->wait();
}

void Pipeline::run_all(const std::function<void(int)>& fn) {
  std::mutex mu;
  std::exception_ptr first;
  auto guarded = [&](int i) {
    try {
      try {
        fn(i);
      } catch (const std::bad_alloc&) {
        // Containers, unlike tensors, fail this way: say which settings shrink memory.
        throw OutOfMemoryError(cat("stage ", endpoints_[i]->rank(),
                                   " ran out of host memory: use more chunks (--chunks), fewer microbatches ",
                                   "(--microbatches), a smaller --batch or --seq-len, or a smaller model"));
      }
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mu);
      if (!first) first = std::current_exception();  // later errors are usually "peer failed"
      endpoints_[i]->abort(e.what());
    }
  };
  if (threads_.empty()) guarded(0);
  for (int i = 0; i < int(threads_.size()); ++i) threads_[i]->start([&guarded, i] { guarded(i); });
  for (auto& t : threads_) t->wait();
  if (first) std::rethrow_exception(first);
}

PipelineStepResult Pipeline::forward_backward(const Batch& global) {
  Batch slice;
  if (group_) {
    slice = replica_slice(global, replica(), replicas());
    SF_CHECK(slice.batch % cfg_.microbatches == 0, "each of the ", replicas(), " replicas takes ", slice.batch,
             " of the ", global.batch, " sequences, which do not split into ", cfg_.microbatches,
             " microbatches: use a --batch that is a multiple of --data-parallel x --microbatches");
  }
  const Batch& batch = group_ ? slice : global;
  PipelineStepResult r;
  r.stages.resize(stages_.size());
  run_all([&](int i) { r.stages[i] = stages_[i]->forward_backward(batch); });
  r.loss = r.stages[0].loss;
  r.stats = r.stages[0].stats;
  if (group_) {  // each replica's share of the global mean: their sum is the step's
    r.loss = group_->all_reduce_sum(r.loss);
    r.stats.loss_sum = group_->all_reduce_sum(r.stats.loss_sum);
    r.stats.correct = int64_t(group_->all_reduce_sum(double(r.stats.correct)));
    r.stats.counted = int64_t(group_->all_reduce_sum(double(r.stats.counted)));
  }
  r.makespan_s = r.stages[0].makespan_s;
  r.bubble_fraction = r.stages[0].bubble_fraction();
  return r;
}

double Pipeline::grad_norm() {
  std::vector<double> norms(stages_.size());
  run_all([&](int i) { norms[i] = stages_[i]->grad_norm(); });
  return norms[0];
}

Pipeline::NonfiniteGrad Pipeline::locate_nonfinite_grad() {
  NonfiniteGrad out;
  for (auto& s : stages_)  // ascending ranks: the last one found is the highest
    if (std::string name = s->last_nonfinite_grad(); !name.empty()) out = {s->rank(), name};
  const int highest = static_cast<int>(max_over_processes(out.stage));
  if (highest != out.stage) out = {highest, ""};
  return out;
}

void Pipeline::clip_and_update(double lr, double norm) {
  run_all([&](int i) { stages_[i]->clip_and_update(lr, norm); });
}

// Over the stage group, then over the pipeline: every rank of the grid once.
double Pipeline::max_over_processes(double v) {
  if (group_) v = group_->all_reduce_max(v);
  return runs_all_stages() ? v : endpoints_.front()->all_reduce_max(v);
}

double Pipeline::sum_over_processes(double v) {
  if (group_) v = group_->all_reduce_sum(v);
  return runs_all_stages() ? v : endpoints_.front()->all_reduce_sum(v);
}

void Pipeline::zero_grads() {
  run_all([&](int i) { stages_[i]->zero_grads(); });
}

void Pipeline::set_chunk_lengths(const std::vector<int64_t>& lengths) {
  PipelineConfig next = cfg_;
  next.chunk_lengths = lengths;
  reshape(next);
}

void Pipeline::reshape(const PipelineConfig& next) {
  // Refused here, before any stage: a stage's error would abort the transports.
  const std::string differs = model_and_placement_difference(cfg_, next);
  SF_CHECK(differs.empty(), "reshape cannot change the ", differs, " of a pipeline (build another one)");
  run_all([&](int i) { stages_[i]->reshape(next); });
  cfg_ = next;
}

void Pipeline::release_cached_device_memory() {
  run_all([&](int i) { stages_[i]->release_cached_device_memory(); });
}

std::vector<Stage*> Pipeline::stages() {
  std::vector<Stage*> out;
  for (auto& s : stages_) out.push_back(s.get());
  return out;
}

std::unique_ptr<Pipeline> make_local_pipeline(const PipelineConfig& cfg) {
  return std::make_unique<Pipeline>(cfg, make_local_transports(cfg.stages, cfg.timeout_s, cfg.split_sms));
}

}  // namespace stateflow
