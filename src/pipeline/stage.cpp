#include "pipeline/stage.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <map>

#include "pipeline/check.h"
#include "pipeline/lower.h"
#include "pipeline/partition.h"
#include "model/device_ops.h"
#include "pipeline/units.h"

namespace stateflow {

Stage::Stage(const PipelineConfig& cfg, int rank, Transport& transport, Transport* group)
    : cfg_(cfg),
      rank_(rank),
      transport_(transport),
      tracker_("stage " + std::to_string(rank)),
      device_memory_{tracker_, cfg.device} {
  SF_CHECK(transport.world_size() == cfg.stages, "the transport has ", transport.world_size(),
           " ranks but --stages is ", cfg.stages, "; launch one process per stage (mpirun -n ", cfg.stages, ")");
  if (const int gpu = transport.cuda_device(); gpu >= 0) {
    SF_CHECK(cfg.device == Device::CUDA, "the ", transport.name(), " transport runs stage ", rank, " on GPU ", gpu,
             ": use --device cuda");
    init_device(Device::CUDA);
    device_backend(Device::CUDA).use_device(gpu);  // before anything of the stage is allocated
  }
  if (cfg.split_sms) {
    SF_CHECK(cfg.device == Device::CUDA && transport.cuda_device() < 0 && cfg.stages > 1,
             "--sm-split splits one GPU's multiprocessors between the stages of one process: it needs --device cuda, "
             "--transport local and --stages 2 or more");
    use_gpu_sm_partition(rank, cfg.stages);  // before anything is allocated or launched
  }
  make_actions();
  auto [begin, end] = stage_layer_ranges(cfg.model, cfg.stages).at(rank);
  TrackerScope scope(tracker_);
  model_ = std::make_unique<Model>(cfg.model, cfg.dtype, begin, end, cfg.device);
  executor_ = std::make_unique<StageExecutor>(model_->layers(), begin, cfg.recompute);
  executor_->allow_graphs(!shares_gpu());
  optimizer_ = std::make_unique<AdamW>(model_->params(), cfg.adamw);
  if (cfg.device != Device::CPU) clock_ = device_backend(cfg.device).make_clock();
  if (group) {
    std::vector<std::vector<Param*>> layer_params;
    for (Layer* l : model_->layers()) layer_params.push_back(l->params());
    reducer_ = std::make_unique<GradientReducer>(layer_params, *group, rank, cfg.bucket_bytes);
  }
}

void Stage::make_actions() {
  const int N = static_cast<int>(cfg_.chunk_lengths.size());
  Schedule s = make_schedule(cfg_.schedule, cfg_.stages, cfg_.microbatches, N);
  CheckResult check = check_schedule(s);
  SF_CHECK(check.ok, "the ", kind_name(cfg_.schedule), " schedule failed its check:\n", check.message);
  lowered_ = lower_schedule(s);
  const std::vector<Action>& actions = lowered_.per_stage.at(rank_);
  for (size_t i = 0; i < actions.size(); ++i)
    if (actions[i].op == Op::Backward) last_backward_ = i;
}

Stage::DeviceMemoryRelease::~DeviceMemoryRelease() {
  if (device != Device::CPU && device_available(device)) device_backend(device).release_memory(tracker);
}

// The step's loss statistics that GPU loss layers added up on the device (one read per step).
static LossStats read_device_loss_stats(const Tensor& sums, int64_t vocab) {
  DeviceLossStats d;
  const Tensor host = sums.to(Device::CPU);
  std::memcpy(&d, host.raw(), sizeof d);
  SF_CHECK(d.bad_targets == 0, "cross_entropy: ", d.bad_targets, " targets are outside [0, ", vocab,
           ") and are not the ignore value -1 (check the tokenizer against the model's vocab_size)");
  LossStats s;
  s.loss_sum = d.loss_sum, s.correct = int64_t(d.correct), s.counted = int64_t(d.counted);
  return s;
}

// Replaces the host times of a step by the device's: marks[k] are the device marks around
// action k of r.timeline, mark 0 is the step start and end_mark its end.
static void take_device_times(DeviceClock& clock, const std::vector<std::pair<int, int>>& marks, int end_mark,
                              StageStepResult& r) {
  r.busy_s = 0;
  for (size_t k = 0; k < marks.size(); ++k) {
    TimedAction& t = r.timeline[k];
    t.start = clock.seconds_between(0, marks[k].first), t.end = clock.seconds_between(0, marks[k].second);
    if (is_compute(t.action)) r.busy_s += t.end - t.start;
  }
  r.wall_s = clock.seconds_between(0, end_mark);
}

std::string model_and_placement_difference(const PipelineConfig& a, const PipelineConfig& b) {
  if (a.model.to_json() != b.model.to_json()) return "model";
  if (a.dtype != b.dtype) return "dtype";
  if (a.device != b.device) return "device";
  if (a.stages != b.stages) return "stages";
  const AdamWConfig &x = a.adamw, &y = b.adamw;
  if (x.beta1 != y.beta1 || x.beta2 != y.beta2 || x.eps != y.eps || x.weight_decay != y.weight_decay || a.clip != b.clip)
    return "optimizer";
  if (a.timeout_s != b.timeout_s) return "timeout";
  if (a.split_sms != b.split_sms) return "SM split";
  if (a.data_parallel != b.data_parallel || a.bucket_bytes != b.bucket_bytes) return "data parallelism";
  return "";
}

void Stage::release_cached_device_memory() {
  if (cfg_.device != Device::CPU) device_backend(cfg_.device).release_cached_memory(tracker_);
}

void Stage::reshape(const PipelineConfig& next) {
  SF_CHECK(executor_->units_in_flight() == 0, "stage ", rank_, ": a pipeline changes its shape only between steps");
  const std::string differs = model_and_placement_difference(cfg_, next);
  SF_CHECK(differs.empty(), "stage ", rank_, ": reshape cannot change the ", differs, " of a stage (build another one)");
  const bool new_actions = next.schedule != cfg_.schedule || next.microbatches != cfg_.microbatches ||
                           next.chunk_lengths.size() != cfg_.chunk_lengths.size();
  const bool new_executor = next.recompute != cfg_.recompute;
  cfg_ = next;
  if (new_actions) make_actions();
  if (new_executor) {
    TrackerScope scope(tracker_);
    executor_ = std::make_unique<StageExecutor>(model_->layers(), model_->begin(), cfg_.recompute);
    executor_->allow_graphs(!shares_gpu());
  }
}

void Stage::zero_grads() {
  TrackerScope scope(tracker_);
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

  // On a GPU the loss layer adds the loss statistics up on the device: no wait per chunk.
  const bool gpu = cfg_.device != Device::CPU;
  static_assert(sizeof(DeviceLossStats) % sizeof(double) == 0);
  const int64_t stats_words = sizeof(DeviceLossStats) / sizeof(double);
  const Tensor device_stats =
      gpu && last ? Tensor::zeros({stats_words}, DType::F64, MemCategory::Other, cfg_.device) : Tensor();
  // The GPU is idle when the stages line up, so its first mark is the step start.
  if (gpu) device_backend(cfg_.device).synchronize();
  transport_.all_reduce_sum(0);  // line the stages up so their clocks start together
  const auto t0 = std::chrono::steady_clock::now();
  auto now = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  std::vector<std::pair<int, int>> marks;  // GPU: the device marks around each action
  if (gpu) clock_->clear(), clock_->mark();
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
    const int start_mark = gpu ? clock_->mark() : -1;
    switch (a.op) {
      case Op::Recv:
        received[p][key] = transport_.recv(a.peer, tag, spec(a.chunk));
        break;
      case Op::Send:
        transport_.send(a.peer, tag, take(to_send[p], key));
        break;
      case Op::Forward: {
        Unit& u = units[key] = plan.make_unit(a.microbatch, a.chunk, &stats);
        if (device_stats.defined()) u.ctx.device_stats = reinterpret_cast<DeviceLossStats*>(device_stats.raw());
        Tensor y = executor_->forward(u.ctx, first ? u.tokens : take(received[0], key));
        if (!last)
          to_send[0][key] = y;
        else if (!gpu)
          r.loss += y.item();  // a GPU adds it up on the device
        break;
      }
      case Op::Backward: {
        auto it = units.find(key);
        SF_CHECK(it != units.end(), "engine: backward of unit (", a.microbatch, ", ", a.chunk, ") before its forward");
        // The step's last backward makes each layer's gradients final on the way down.
        std::function<void(int)> layer_done;
        if (reducer_ && i == last_backward_) layer_done = [&](int j) { reducer_->layer_done(j); };
        Tensor dx = executor_->backward(it->second.ctx, last ? Tensor() : take(received[1], key), layer_done);
        units.erase(it);
        if (!first) to_send[1][key] = dx;
        break;
      }
    }
    if (batch_ends) transport_.end_batch();
    r.timeline.push_back({a, start, now()});  // receives show how long a stage waited
    if (gpu) marks.emplace_back(start_mark, clock_->mark());
    if (is_compute(a)) r.busy_s += r.timeline.back().end - start;
  }
  if (reducer_) reducer_->finish();
  transport_.flush();
  if (gpu) {
    // Device kernels run asynchronously: the step ends when they are done, and the device
    // marks give the times of the work rather than of its launch.
    r.host_issue_s = now();
    const int end_mark = clock_->mark();
    device_backend(cfg_.device).synchronize();
    take_device_times(*clock_, marks, end_mark, r);
    if (last) {
      stats = read_device_loss_stats(device_stats, cfg_.model.vocab_size);
      r.loss = stats.loss_sum * plan.loss_scale();
    }
  } else {
    r.wall_s = now();
  }
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
  TrackerScope scope(tracker_);  // device reductions take scratch memory
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
  TrackerScope scope(tracker_);
  std::vector<Param*> params = model_->params();
  for (auto it = params.rbegin(); it != params.rend(); ++it)
    if (!all_finite((*it)->grad.on_host() ? (*it)->grad : (*it)->grad.to(Device::CPU))) return (*it)->name;
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
