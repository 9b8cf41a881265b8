#include "train/bench_depth.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <ostream>

#include "model/mixer.h"
#include "model/model.h"
#include "pipeline/partition.h"
#include "train/planner.h"

namespace stateflow {

namespace {

// A model's average block (mixer + MLP): forward and backward FLOPs per token and activation
// width (the mixer's, 2 d_model for the norms' inputs, 3 MLP widths).
struct BlockUnit {
  double forward = 0, backward = 0, width = 0;
};

BlockUnit block_unit(const ModelConfig& m, char letter, int64_t seq_len) {
  const BlockFlops f = block_flops_per_token(m, letter, seq_len);
  return {f.forward(), f.backward(),
          mixer_for_letter(letter).activation_width(m) + 2.0 * m.d_model + 3.0 * m.mlp_hidden};
}

BlockUnit average_block(const ModelConfig& m, int64_t seq_len) {
  BlockUnit avg;
  for (char letter : m.blocks()) {
    const BlockUnit b = block_unit(m, letter, seq_len);
    avg.forward += b.forward, avg.backward += b.backward, avg.width += b.width;
  }
  const double n = double(m.num_blocks());
  return {avg.forward / n, avg.backward / n, avg.width / n};
}

// What each stage's blocks weigh in units of `unit` (the measured model's average block; for
// a model of equal blocks, its block count), and each stage's parameters.
struct StageWeights {
  std::vector<double> forward, backward, width;
  std::vector<int64_t> params;
};

StageWeights stage_weights(const ModelConfig& m, int P, const BlockUnit& unit, int64_t seq_len) {
  const std::vector<std::string> blocks = stage_blocks(m, P);
  StageWeights w;
  w.params = stage_parameters(m, P);
  for (int r = 0; r < P; ++r) {
    double f = 0, b = 0, width = 0;
    for (char letter : blocks[r]) {
      const BlockUnit u = block_unit(m, letter, seq_len);
      f += u.forward / unit.forward, b += u.backward / unit.backward, width += u.width / unit.width;
    }
    w.forward.push_back(f), w.backward.push_back(b), w.width.push_back(width);
  }
  return w;
}

int64_t resident_of(const MemorySnapshot& m) {
  return m.peak_of(MemCategory::Weights) + m.peak_of(MemCategory::Grads) + m.peak_of(MemCategory::Optimizer);
}

// What one measured row says per block, per head and per parameter (see the header).
struct LayerCosts {
  std::vector<double> block_forward, block_backward, head_forward, head_backward, send;  // [chunk]
  double block_stash = 0, head_stash = 0;  // bytes per unit
  double bytes_per_parameter = 0;
  double transient = 0, last_transient = 0;  // stages before the last (most of them), the last
};

LayerCosts layer_costs(const BenchRow& row, const BenchOptions& o) {
  const int P = o.stages, N = row.chunks(), last = P - 1;
  const ScheduleKind kind = parse_schedule_kind(row.schedule);
  const BlockUnit unit = average_block(o.model, o.seq_len);
  const StageWeights w = stage_weights(o.model, P, unit, o.seq_len);
  const double head_flops = double(o.model.d_model) * double(o.model.vocab_size);  // per token, x2 forward, x4 backward
  auto before_last = [&](const std::vector<double>& per_stage) {
    double sum = 0;
    for (int r = 0; r < last; ++r) sum += per_stage[r];
    return sum;
  };
  LayerCosts l;
  // One measured stage holds the blocks and the head together: its time is split between them
  // by their FLOPs (head_share: the head's fraction of the stage's).
  auto split = [&](const std::vector<std::vector<double>>& per_stage, const std::vector<double>& weight,
                   double head_share, std::vector<double>& block, std::vector<double>& head) {
    for (int c = 0; c < N; ++c) {
      if (last == 0) {
        block.push_back(per_stage[0][c] * (1 - head_share) / weight[0]);
        head.push_back(per_stage[0][c] * head_share);
        continue;
      }
      double time_before_last = 0;
      for (int r = 0; r < last; ++r) time_before_last += per_stage[r][c];
      block.push_back(time_before_last / before_last(weight));
      head.push_back(std::max(0.0, per_stage[last][c] - weight[last] * block.back()));
    }
  };
  split(row.costs.forward_time, w.forward, 2 * head_flops / (2 * head_flops + w.forward[0] * unit.forward),
        l.block_forward, l.head_forward);
  split(row.costs.backward_time, w.backward, 4 * head_flops / (4 * head_flops + w.backward[0] * unit.backward),
        l.block_backward, l.head_backward);
  l.send = row.costs.send_time;
  std::vector<double> unit_stash(P);
  double stash_before_last = 0;
  int64_t resident = 0, all_params = 0;
  for (int r = 0; r < P; ++r) {
    unit_stash[r] = double(row.stage_peak_stash[r]) / in_flight_bound(kind, P, o.microbatches, N, r);
    if (r < last) stash_before_last += unit_stash[r];
    resident += resident_of(row.stage_memory[r]), all_params += w.params[r];
    // The K/V prefixes are predicted from their own formula, not scaled as transient memory.
    const double transient = double(row.stage_memory[r].total_peak - resident_of(row.stage_memory[r]) -
                                    row.stage_peak_stash[r] - row.stage_memory[r].peak_of(MemCategory::KvPrefix));
    if (r < last) l.transient = std::max(l.transient, transient);
    else l.last_transient = transient;
  }
  if (last == 0) {  // one stage: its stash counted as the blocks', its transient memory for every stage
    l.block_stash = unit_stash[0] / w.width[0];
    l.transient = l.last_transient;
  } else {
    l.block_stash = stash_before_last / before_last(w.width);
    l.head_stash = std::max(0.0, unit_stash[last] - w.width[last] * l.block_stash);
  }
  l.bytes_per_parameter = double(resident) / double(all_params);
  return l;
}

DepthPrediction predict(const BenchRow& row, const LayerCosts& l, const DepthPredictions& d, const BenchOptions& o,
                        int P) {
  const int N = row.chunks();
  ModelConfig target = d.model;
  target.pattern = target.blocks();  // cut evenly by cost over the P stages
  const StageWeights w = stage_weights(target, P, average_block(o.model, o.seq_len), o.seq_len);
  const double d_ratio = double(target.d_model) / double(o.model.d_model);
  CostTable t;
  t.forward_time.assign(P, std::vector<double>(N));
  t.backward_time.assign(P, std::vector<double>(N));
  t.unit_bytes.assign(P, std::vector<ByteCounts>(N, ByteCounts{}));
  t.resident_bytes.assign(P, ByteCounts{});
  for (int s = 0; s < P; ++s) {
    const bool last = s == P - 1;
    for (int c = 0; c < N; ++c) {
      t.forward_time[s][c] = w.forward[s] * l.block_forward[c] + (last ? l.head_forward[c] * d.head_ratio : 0);
      t.backward_time[s][c] = w.backward[s] * l.block_backward[c] + (last ? l.head_backward[c] * d.head_ratio : 0);
      t.unit_bytes[s][c][int(MemCategory::Activations)] =
          int64_t(w.width[s] * l.block_stash + (last ? l.head_stash * d_ratio : 0));
    }
    t.resident_bytes[s][int(MemCategory::Weights)] = int64_t(double(w.params[s]) * l.bytes_per_parameter);
    t.resident_bytes[s][int(MemCategory::Other)] = int64_t((last ? l.last_transient : l.transient) * d.width_ratio);
  }
  for (double s : l.send) t.send_time.push_back(s * d_ratio);
  const StagePrefixBytes kv = kv_prefix_bytes(target, P, o.batch / o.microbatches * o.seq_len, o.device, o.dtype);
  t.kv_prefix_bytes = kv.prefix, t.kv_grad_bytes = kv.grad;
  const SimResult sim = simulate(make_schedule(parse_schedule_kind(row.schedule), P, o.microbatches, N), t);
  DepthPrediction p{.schedule = row.schedule, .stages = P, .chunks = N, .step_s = sim.makespan,
                    .tokens_per_s = sim.makespan > 0 ? double(o.batch * o.seq_len) / sim.makespan : 0,
                    .bubble = sim.bubble_fraction, .stage_peak_bytes = sim.peak_total_bytes};
  p.peak_bytes = *std::max_element(p.stage_peak_bytes.begin(), p.stage_peak_bytes.end());
  for (const ByteCounts& b : sim.peak_bytes)
    p.peak_kv_prefix_bytes = std::max(p.peak_kv_prefix_bytes, b[int(MemCategory::KvPrefix)]);
  p.oom = double(p.peak_bytes) > o.gpu_memory_bytes;
  return p;
}

}  // namespace

void check_depth_targets(const BenchOptions& o) {
  if (o.simulate_stages.empty()) return;
  for (const ModelConfig& m : o.simulate_models)
    for (int P : o.simulate_stages) {
      ModelConfig even = m;
      even.pattern = even.blocks();
      SF_CHECK(P <= even.num_blocks(), "--simulate-stages ", P, ": model ", m.name, " has only ", m.num_blocks(),
               " blocks; predict for at most that many stages or a bigger --simulate-model");
      stage_layer_ranges(even, P);
    }
}

DepthPredictions predict_depths(const BenchResult& r, const BenchOptions& o, const ModelConfig& target) {
  DepthPredictions d;
  d.model = target;
  d.scaled = target.to_json() != o.model.to_json();
  if (d.scaled) {
    const BlockUnit measured = average_block(o.model, o.seq_len), target_block = average_block(d.model, o.seq_len);
    d.forward_ratio = target_block.forward / measured.forward;
    d.backward_ratio = target_block.backward / measured.backward;
    d.head_ratio = double(d.model.d_model * d.model.vocab_size) / double(o.model.d_model * o.model.vocab_size);
    d.width_ratio = target_block.width / measured.width;
  }
  for (int P : o.simulate_stages) {
    const size_t first = d.rows.size();
    for (const BenchRow& row : r.rows)
      if (!row.oom) d.rows.push_back(predict(row, layer_costs(row, o), d, o, P));
    DepthPrediction* best = nullptr;
    for (size_t i = first; i < d.rows.size(); ++i)
      if (d.rows[i].schedule == "stateflow" && !d.rows[i].oom && (!best || d.rows[i].tokens_per_s > best->tokens_per_s))
        best = &d.rows[i];
    if (best) best->best = true;
  }
  return d;
}

void print_depth_predictions(const DepthPredictions& d, const BenchOptions& o, std::ostream& os) {
  if (d.rows.empty()) return;
  os << "PREDICTED, not measured: the simulator with this run's per-action costs, for " << d.model.name << " ("
     << d.model.num_parameters() << " parameters), its blocks spread evenly over P stages, batch " << o.batch << " x "
     << o.seq_len << ", M=" << o.microbatches << (o.recompute ? ", full recomputation" : "") << "\n";
  if (d.scaled) {
    char line[256];
    std::snprintf(line, sizeof line,
                  "  measured on %s, scaled: block forward x%.3f, backward x%.3f (FLOPs per token), LM head x%.3f, "
                  "stash and transient bytes x%.3f (activation width)\n",
                  o.model.name.c_str(), d.forward_ratio, d.backward_ratio, d.head_ratio, d.width_ratio);
    os << line;
  }
  os << "  peak memory: parameters' weights, grads and optimizer + transient + stash in flight + K/V prefixes "
        "(kv_prefix: attention's, with their gradients); OOM above "
     << format_bytes(int64_t(o.gpu_memory_bytes)) << " (--gpu-memory)\n";
  char line[256];
  std::snprintf(line, sizeof line, "%4s %-10s %4s %10s %11s %9s %12s %12s\n", "P", "schedule", "N", "step s",
                "tokens/s", "bubble", "peak/stage", "kv_prefix");
  os << line;
  for (const DepthPrediction& p : d.rows) {
    std::snprintf(line, sizeof line, "%4d %-10s %4d %10.4f %11.0f %9.3f %12s %12s%s%s\n", p.stages,
                  p.schedule.c_str(), p.chunks, p.step_s, p.tokens_per_s, p.bubble, format_bytes(p.peak_bytes).c_str(),
                  p.peak_kv_prefix_bytes ? format_bytes(p.peak_kv_prefix_bytes).c_str() : "-", p.oom ? "  OOM" : "",
                  p.best ? "  <- best N" : "");
    os << line;
  }
}

nlohmann::json depth_predictions_json(const DepthPredictions& d, const BenchOptions& o) {
  nlohmann::json j = {{"predicted", true},
                      {"model", d.model.to_json()},
                      {"parameters", d.model.num_parameters()},
                      {"scaled_from", d.scaled ? o.model.name : std::string()},
                      {"forward_ratio", d.forward_ratio},
                      {"backward_ratio", d.backward_ratio},
                      {"head_ratio", d.head_ratio},
                      {"width_ratio", d.width_ratio},
                      {"gpu_memory_bytes", o.gpu_memory_bytes},
                      {"rows", nlohmann::json::array()}};
  for (const DepthPrediction& p : d.rows)
    j["rows"].push_back({{"stages", p.stages},
                         {"schedule", p.schedule},
                         {"chunks", p.chunks},
                         {"step_s", p.step_s},
                         {"tokens_per_s", p.tokens_per_s},
                         {"bubble", p.bubble},
                         {"stage_peak_bytes", p.stage_peak_bytes},
                         {"peak_bytes_max", p.peak_bytes},
                         {"peak_kv_prefix_bytes", p.peak_kv_prefix_bytes},
                         {"oom", p.oom},
                         {"best", p.best}});
  return j;
}

}  // namespace stateflow
