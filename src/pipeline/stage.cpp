#include "pipeline/stage.h"

#include <chrono>
#include <cmath>
#include <map>

#include "pipeline/check.h"
#include "pipeline/lower.h"
#include "pipeline/partition.h"
#include "train/units.h"

namespace stateflow {

Stage::Stage(const PipelineConfig& cfg, int rank, Transport& transport)
    : cfg_(cfg), rank_(rank), transport_(transport), tracker_("stage " + std::to_string(rank)) {
  SF_CHECK(transport.world_size() == cfg.stages, "the transport has ", transport.world_size(),
           " ranks but --stages is ", cfg.stages, "; launch one process per stage (mpirun -n ", cfg.stages, ")");
  const int N = static_cast<int>(cfg.chunk_lengths.size());
  Schedule s = make_schedule(cfg.schedule, cfg.stages, cfg.microbatches, N);
  CheckResult check = check_schedule(s);
  SF_CHECK(check.ok, "the ", kind_name(cfg.schedule), " schedule failed its check:\n", check.message);
  lowered_ = lower_schedule(s);
  auto [begin, end] = stage_layer_ranges(cfg.model, cfg.stages).at(rank);
  TrackerScope scope(tracker_);
  model_ = std::make_unique<Model>(cfg.model, cfg.dtype, begin, end, cfg.device);
  executor_ = std::make_unique<StageExecutor>(model_->layers(), begin, cfg.recompute);
  optimizer_ = std::make_unique<AdamW>(model_->params(), cfg.adamw);
}

void Stage::zero_grads() {
  std::vector<Param*> p = model_->params();
  stateflow::zero_grads(p);
}

StageStepResult Stage::forward_backward(const Batch& batch) {
  TrackerScope scope(tracker_);
  UnitPlan plan(batch, cfg_.microbatches, cfg_.chunk_lengths);
  const bool first = rank_ == 0, last = rank_ == cfg_.stages - 1;
  StageStepResult r;
  LossStats stats;
  std::map<std::pair<int, int>, Unit> units;            // in flight on this stage
  std::map<std::pair<int, int>, Tensor> received[2];    // by payload: activations, gradients
  std::map<std::pair<int, int>, Tensor> to_send[2];
  auto take = [](std::map<std::pair<int, int>, Tensor>& m, std::pair<int, int> k) {
    auto it = m.find(k);
    SF_CHECK(it != m.end(), "engine: unit (", k.first, ", ", k.second, ") has no tensor where the schedule needs one");
    Tensor t = std::move(it->second);
    m.erase(it);
    return t;
  };

  transport_.all_reduce_sum(0);  // line the stages up so their clocks start together
  const auto t0 = std::chrono::steady_clock::now();
  auto now = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  CategoryScope activations(MemCategory::Activations);
  // A message of unit (m,c), activation or gradient alike: [rows of the microbatch's chunk,
  // d_model] in the activation type (bf16 on the GPU) on the stage's device.
  auto spec = [&](int c) {
    return MessageSpec{{batch.batch / cfg_.microbatches * cfg_.chunk_lengths.at(c), cfg_.model.d_model},
                       cfg_.device == Device::CPU ? cfg_.dtype : DType::BF16, cfg_.device};
  };
  const std::vector<Action>& actions = lowered_.per_stage.at(rank_);
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    // A run of consecutive sends and receives goes out as one batch (one NCCL group).
    const bool comm = !is_compute(a), batch_starts = comm && (i == 0 || is_compute(actions[i - 1])),
               batch_ends = comm && (i + 1 == actions.size() || is_compute(actions[i + 1]));
    if (batch_starts) transport_.begin_batch();
    const std::pair<int, int> key{a.microbatch, a.chunk};
    const MessageTag tag{a.payload, a.microbatch, a.chunk};
    const int p = a.payload == Payload::Activation ? 0 : 1;
    const double start = now();
    switch (a.op) {
      case Op::Recv:
        received[p][key] = transport_.recv(a.peer, tag, spec(a.chunk));
        break;
      case Op::Send:
        transport_.send(a.peer, tag, take(to_send[p], key));
        break;
      case Op::Forward: {
        Unit& u = units[key] = plan.make_unit(a.microbatch, a.chunk, &stats);
        Tensor y = executor_->forward(u.ctx, first ? u.tokens : take(received[0], key));
        if (last)
          r.loss += y.item();
        else
          to_send[0][key] = y;
        break;
      }
      case Op::Backward: {
        auto it = units.find(key);
        SF_CHECK(it != units.end(), "engine: backward of unit (", a.microbatch, ", ", a.chunk, ") before its forward");
        Tensor dx = executor_->backward(it->second.ctx, last ? Tensor() : take(received[1], key));
        units.erase(it);
        if (!first) to_send[1][key] = dx;
        break;
      }
    }
    if (batch_ends) transport_.end_batch();
    r.timeline.push_back({a, start, now()});  // receives show how long a stage waited
    if (is_compute(a)) r.busy_s += r.timeline.back().end - start;
  }
  transport_.flush();
  // Device kernels run asynchronously: the step ends when they are done.
  if (cfg_.device != Device::CPU) device_backend(cfg_.device).synchronize();
  r.wall_s = now();
  SF_CHECK(executor_->units_in_flight() == 0, "engine: stage ", rank_, " ended the step with units in flight");
  // Only the last stage computed the loss; every stage reports the step's totals.
  r.loss = transport_.all_reduce_sum(r.loss);
  r.stats.loss_sum = transport_.all_reduce_sum(stats.loss_sum);
  r.stats.correct = static_cast<int64_t>(transport_.all_reduce_sum(double(stats.correct)));
  r.stats.counted = static_cast<int64_t>(transport_.all_reduce_sum(double(stats.counted)));
  r.P = cfg_.stages;
  r.makespan_s = transport_.all_reduce_max(r.wall_s);
  r.total_busy_s = transport_.all_reduce_sum(r.busy_s);
  return r;
}

double Stage::grad_norm() {
  return std::sqrt(transport_.all_reduce_sum(grad_sq_sum(model_->params())));
}

static bool all_finite(const Tensor& t) {
  return dispatch_float(t.dtype(), [&](auto z) {
    using T = decltype(z);
    const T* p = t.data<T>();
    for (int64_t i = 0; i < t.numel(); ++i)
      if (!std::isfinite(p[i])) return false;
    return true;
  });
}

std::string Stage::last_nonfinite_grad() {
  std::vector<Param*> params = model_->params();
  for (auto it = params.rbegin(); it != params.rend(); ++it)
    if (!all_finite((*it)->grad)) return (*it)->name;
  return "";
}

void Stage::clip_and_update(double lr, double norm) {
  TrackerScope scope(tracker_);
  SF_CHECK(std::isfinite(norm), "the gradient norm is ", norm, " (stage ", rank_,
           " sees it); lower --lr or check the data (the weights were not updated)");
  std::vector<Param*> params = model_->params();
  if (cfg_.clip > 0 && norm > cfg_.clip) scale_grads(params, cfg_.clip / norm);
  optimizer_->step(lr);
}

}  // namespace stateflow
