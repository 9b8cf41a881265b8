#include "train/bench_depth.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <ostream>

#include "pipeline/partition.h"

namespace stateflow {

namespace {

// GDN blocks on each stage: the flat layers 1 .. 2 n_layers are (mixer, MLP) pairs, and stages
// are cut between blocks.
std::vector<int> blocks_per_stage(const ModelConfig& m, int P) {
  std::vector<int> blocks;
  for (auto [begin, end] : stage_layer_ranges(m, P))
    blocks.push_back((std::min<int>(end, 2 * m.n_layers + 1) - std::max(begin, 1)) / 2);
  return blocks;
}

std::vector<int64_t> parameters_per_stage(const ModelConfig& m, int P) {
  const int64_t embedding = m.vocab_size * m.d_model, head = m.d_model + m.d_model * m.vocab_size;
  const int64_t block = (m.num_parameters() - embedding - head) / m.n_layers;
  std::vector<int> blocks = blocks_per_stage(m, P);
  std::vector<int64_t> params;
  for (int s = 0; s < P; ++s) params.push_back(blocks[s] * block + (s == 0 ? embedding : 0) + (s == P - 1 ? head : 0));
  return params;
}

double activation_width(const ModelConfig& m) {
  const double hk = double(m.n_heads * m.head_dk), hv = double(m.n_heads * m.head_dv);
  return 2.0 * m.d_model + 2 * hk + 2 * hv + 2.0 * m.n_heads + 3.0 * m.mlp_hidden;
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
  const std::vector<int> blocks = blocks_per_stage(o.model, P);
  const std::vector<int64_t> params = parameters_per_stage(o.model, P);
  int blocks_before_last = 0;
  for (int r = 0; r < last; ++r) blocks_before_last += blocks[r];
  LayerCosts l;
  auto split = [&](const std::vector<std::vector<double>>& per_stage, std::vector<double>& block,
                   std::vector<double>& head) {
    for (int c = 0; c < N; ++c) {
      double before_last = 0;
      for (int r = 0; r < last; ++r) before_last += per_stage[r][c];
      block.push_back(before_last / blocks_before_last);
      head.push_back(std::max(0.0, per_stage[last][c] - blocks[last] * block.back()));
    }
  };
  split(row.costs.forward_time, l.block_forward, l.head_forward);
  split(row.costs.backward_time, l.block_backward, l.head_backward);
  l.send = row.costs.send_time;
  std::vector<double> unit_stash(P);
  double stash_before_last = 0;
  int64_t resident = 0, all_params = 0;
  for (int r = 0; r < P; ++r) {
    unit_stash[r] = double(row.stage_peak_stash[r]) / in_flight_bound(kind, P, o.microbatches, N, r);
    if (r < last) stash_before_last += unit_stash[r];
    resident += resident_of(row.stage_memory[r]), all_params += params[r];
    const double transient =
        double(row.stage_memory[r].total_peak - resident_of(row.stage_memory[r]) - row.stage_peak_stash[r]);
    if (r < last) l.transient = std::max(l.transient, transient);
    else l.last_transient = transient;
  }
  l.block_stash = stash_before_last / blocks_before_last;
  l.head_stash = std::max(0.0, unit_stash[last] - blocks[last] * l.block_stash);
  l.bytes_per_parameter = double(resident) / double(all_params);
  return l;
}

DepthPrediction predict(const BenchRow& row, const LayerCosts& l, const DepthPredictions& d, const BenchOptions& o,
                        int P) {
  const int N = row.chunks();
  ModelConfig target = d.model;
  target.stage_pattern.clear();  // blocks spread evenly over the P stages
  const std::vector<int> blocks = blocks_per_stage(target, P);
  const std::vector<int64_t> params = parameters_per_stage(target, P);
  const double d_ratio = double(target.d_model) / double(o.model.d_model);
  CostTable t;
  t.forward_time.assign(P, std::vector<double>(N));
  t.backward_time.assign(P, std::vector<double>(N));
  t.unit_bytes.assign(P, std::vector<ByteCounts>(N, ByteCounts{}));
  t.resident_bytes.assign(P, ByteCounts{});
  for (int s = 0; s < P; ++s) {
    const bool last = s == P - 1;
    for (int c = 0; c < N; ++c) {
      t.forward_time[s][c] = blocks[s] * l.block_forward[c] * d.forward_ratio + (last ? l.head_forward[c] * d.head_ratio : 0);
      t.backward_time[s][c] =
          blocks[s] * l.block_backward[c] * d.backward_ratio + (last ? l.head_backward[c] * d.head_ratio : 0);
      t.unit_bytes[s][c][int(MemCategory::Activations)] =
          int64_t(blocks[s] * l.block_stash * d.width_ratio + (last ? l.head_stash * d_ratio : 0));
    }
    t.resident_bytes[s][int(MemCategory::Weights)] = int64_t(double(params[s]) * l.bytes_per_parameter);
    t.resident_bytes[s][int(MemCategory::Other)] = int64_t((last ? l.last_transient : l.transient) * d.width_ratio);
  }
  for (double s : l.send) t.send_time.push_back(s * d_ratio);
  const SimResult sim = simulate(make_schedule(parse_schedule_kind(row.schedule), P, o.microbatches, N), t);
  DepthPrediction p{.schedule = row.schedule, .stages = P, .chunks = N, .step_s = sim.makespan,
                    .tokens_per_s = sim.makespan > 0 ? double(o.batch * o.seq_len) / sim.makespan : 0,
                    .bubble = sim.bubble_fraction, .stage_peak_bytes = sim.peak_total_bytes};
  p.peak_bytes = *std::max_element(p.stage_peak_bytes.begin(), p.stage_peak_bytes.end());
  p.oom = double(p.peak_bytes) > o.gpu_memory_bytes;
  return p;
}

}  // namespace

void check_depth_targets(const BenchOptions& o) {
  if (o.simulate_stages.empty()) return;
  SF_CHECK(o.stages >= 2, "--simulate-stages needs a measured run of at least 2 stages (--stages 2) to tell the "
                          "blocks' costs from the LM head's");
  for (const ModelConfig& m : o.simulate_models)
    for (int P : o.simulate_stages) {
      ModelConfig even = m;
      even.stage_pattern.clear();
      SF_CHECK(P <= even.n_layers, "--simulate-stages ", P, ": model ", m.name, " has only ", m.n_layers,
               " GDN blocks; predict for at most that many stages or a bigger --simulate-model");
      stage_layer_ranges(even, P);
    }
}

DepthPredictions predict_depths(const BenchResult& r, const BenchOptions& o, const ModelConfig& target) {
  SF_CHECK(o.stages >= 2, "--simulate-stages needs a measured run of at least 2 stages (--stages 2)");
  DepthPredictions d;
  d.model = target;
  d.scaled = target.to_json() != o.model.to_json();
  if (d.scaled) {
    const BlockFlops measured = block_flops_per_token(o.model), target_flops = block_flops_per_token(d.model);
    d.forward_ratio = target_flops.forward() / measured.forward();
    d.backward_ratio = target_flops.backward() / measured.backward();
    d.head_ratio = double(d.model.d_model * d.model.vocab_size) / double(o.model.d_model * o.model.vocab_size);
    d.width_ratio = activation_width(d.model) / activation_width(o.model);
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
  os << "  peak memory: parameters' weights, grads and optimizer + transient + stash in flight; OOM above "
     << format_bytes(int64_t(o.gpu_memory_bytes)) << " (--gpu-memory)\n";
  char line[256];
  std::snprintf(line, sizeof line, "%4s %-10s %4s %10s %11s %9s %12s\n", "P", "schedule", "N", "step s", "tokens/s",
                "bubble", "peak/stage");
  os << line;
  for (const DepthPrediction& p : d.rows) {
    std::snprintf(line, sizeof line, "%4d %-10s %4d %10.4f %11.0f %9.3f %12s%s%s\n", p.stages, p.schedule.c_str(),
                  p.chunks, p.step_s, p.tokens_per_s, p.bubble, format_bytes(p.peak_bytes).c_str(),
                  p.oom ? "  OOM" : "", p.best ? "  <- best N" : "");
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
                         {"oom", p.oom},
                         {"best", p.best}});
  return j;
}

}  // namespace stateflow
