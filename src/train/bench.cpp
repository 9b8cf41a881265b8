#include "train/bench.h"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <ostream>

#include "pipeline/launch.h"
#include "pipeline/simulate.h"
#include "train/chunking.h"

namespace stateflow {

// The simulator's cost table from the timelines of the timed steps: mean time of every
// (stage, chunk) forward and backward. The whole run is local, or gathered over processes.
static CostTable measured_costs(const std::vector<PipelineStepResult>& steps, Pipeline& pipe, int P, int N) {
  CostTable t;
  t.forward_time.assign(P, std::vector<double>(N, 0.0));
  t.backward_time.assign(P, std::vector<double>(N, 0.0));
  std::vector<std::vector<int>> nf(P, std::vector<int>(N, 0)), nb(P, std::vector<int>(N, 0));
  for (auto& step : steps)
    for (auto& stage : step.stages)
      for (const TimedAction& a : stage.timeline) {
        const int r = a.action.stage, c = a.action.chunk;
        if (a.action.op == Op::Forward) t.forward_time[r][c] += a.end - a.start, ++nf[r][c];
        if (a.action.op == Op::Backward) t.backward_time[r][c] += a.end - a.start, ++nb[r][c];
      }
  for (int r = 0; r < P; ++r)
    for (int c = 0; c < N; ++c) {
      t.forward_time[r][c] = pipe.max_over_processes(nf[r][c] ? t.forward_time[r][c] / nf[r][c] : 0.0);
      t.backward_time[r][c] = pipe.max_over_processes(nb[r][c] ? t.backward_time[r][c] / nb[r][c] : 0.0);
    }
  return t;
}

BenchResult run_bench(const BenchOptions& o) {
  SF_CHECK(o.steps >= 1 && o.warmup_steps >= 0, "bench: --steps must be >= 1 and --warmup-steps >= 0");
  DataConfig dc = o.data;
  if (dc.kind == "recall" && dc.vocab_size == 0) dc.vocab_size = o.model.vocab_size;
  auto data = make_data_source(dc);
  std::vector<Batch> batches;
  for (int i = 0; i < o.warmup_steps + o.steps; ++i) batches.push_back(data->next(o.batch, o.seq_len));

  BenchResult result;
  for (const std::string& name : o.schedules) {
    PipelineConfig pc;
    pc.model = o.model, pc.dtype = o.dtype, pc.device = o.device, pc.stages = o.stages, pc.microbatches = o.microbatches;
    pc.schedule = parse_schedule_kind(name);
    pc.timeout_s = o.timeout_s;
    pc.recompute = o.recompute;
    pc.chunk_lengths = pc.schedule == ScheduleKind::StateFlow ? o.chunk_lengths : std::vector<int64_t>{o.seq_len};
    validate_chunk_lengths(pc.chunk_lengths, o.seq_len);
    auto pipe = make_pipeline(pc, o.transport);
    result.report = is_reporting_rank(*pipe);
    BenchRow row;
    row.schedule = name;
    row.chunks = int(pc.chunk_lengths.size());
    std::vector<PipelineStepResult> timed;
    double seconds = 0;
    for (int i = 0; i < o.warmup_steps + o.steps; ++i) {
      if (i == o.warmup_steps)
        for (Stage* s : pipe->stages()) s->tracker().reset_peaks(), s->executor().reset_peak_stash();
      pipe->zero_grads();
      auto t0 = std::chrono::steady_clock::now();
      PipelineStepResult r = pipe->forward_backward(batches[i]);
      if (i >= o.warmup_steps) {
        seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        row.bubble_measured += r.bubble_fraction / o.steps;
        timed.push_back(std::move(r));
      }
    }
    row.step_s = seconds / o.steps;
    row.tokens_per_s = double(o.batch * o.seq_len) * o.steps / seconds;
    Schedule plan = make_schedule(pc.schedule, pc.stages, pc.microbatches, row.chunks);
    row.bubble_simulated = simulate(plan, measured_costs(timed, *pipe, pc.stages, row.chunks)).bubble_fraction;
    // Every stage's memory, gathered to every process (each process knows its own stages).
    row.stage_memory.assign(pc.stages, MemorySnapshot{});
    row.stage_peak_stash.assign(pc.stages, 0);
    std::vector<MemorySnapshot> local(pc.stages);
    std::vector<int64_t> local_stash(pc.stages, 0);
    for (Stage* s : pipe->stages())
      local[s->rank()] = s->tracker().snapshot(), local_stash[s->rank()] = s->executor().peak_stash_bytes();
    for (int r = 0; r < pc.stages; ++r) {
      for (int c = 0; c < kNumMemCategories; ++c)
        row.stage_memory[r].peak[c] = int64_t(pipe->max_over_processes(double(local[r].peak[c])));
      row.stage_memory[r].total_peak = int64_t(pipe->max_over_processes(double(local[r].total_peak)));
      row.stage_peak_stash[r] = int64_t(pipe->max_over_processes(double(local_stash[r])));
    }
    result.rows.push_back(std::move(row));
  }
  return result;
}

static const BenchRow* baseline(const BenchResult& r) {
  for (auto& row : r.rows)
    if (row.schedule == "1f1b") return &row;
  return nullptr;
}

void print_bench(const BenchResult& r, const BenchOptions& o, std::ostream& os) {
  if (!r.report) return;
  os << "model " << o.model.name << " (" << o.model.num_parameters() << " parameters, " << dtype_name(o.dtype)
     << " on " << device_name(o.device) << "), batch " << o.batch << " x " << o.seq_len << " tokens, P=" << o.stages << ", M=" << o.microbatches
     << ", " << o.transport << " transport, " << (o.recompute ? "full recomputation, " : "") << o.warmup_steps << " warm-up + " << o.steps << " timed steps\n";
  const BenchRow* base = baseline(r);
  char line[512];
  std::snprintf(line, sizeof line, "%-10s %4s %11s %7s %9s %9s %14s %14s %14s\n", "schedule", "N", "tokens/s",
                "x1f1b", "bubble", "bub.sim", "stash s0", "stash/1f1b", "peak total s0");
  os << line;
  for (auto& row : r.rows) {
    const double speed = base ? row.tokens_per_s / base->tokens_per_s : 0;
    const double stash = base && base->stage_peak_stash[0] ? double(row.stage_peak_stash[0]) / base->stage_peak_stash[0] : 0;
    std::snprintf(line, sizeof line, "%-10s %4d %11.0f %7.3f %9.3f %9.3f %14s %14.3f %14s\n", row.schedule.c_str(),
                  row.chunks, row.tokens_per_s, speed, row.bubble_measured, row.bubble_simulated,
                  format_bytes(row.stage_peak_stash[0]).c_str(), stash,
                  format_bytes(row.stage_memory[0].total_peak).c_str());
    os << line;
  }
  os << "peak bytes per stage by category:\n";
  for (auto& row : r.rows)
    for (size_t s = 0; s < row.stage_memory.size(); ++s) {
      os << "  " << row.schedule << " stage " << s << ":";
      for (int c = 0; c < kNumMemCategories; ++c)
        if (row.stage_memory[s].peak[c]) os << " " << mem_category_name(MemCategory(c)) << " " << format_bytes(row.stage_memory[s].peak[c]);
      os << " | total " << format_bytes(row.stage_memory[s].total_peak) << "\n";
    }
}

void write_bench_json(const BenchResult& r, const BenchOptions& o, const std::string& path) {
  if (!r.report) return;
  nlohmann::json j;
  j["model"] = o.model.to_json();
  j["dtype"] = dtype_name(o.dtype);
  j["device"] = device_name(o.device);
  j["batch"] = o.batch, j["seq_len"] = o.seq_len, j["stages"] = o.stages, j["microbatches"] = o.microbatches;
  j["transport"] = o.transport, j["recompute"] = o.recompute, j["warmup_steps"] = o.warmup_steps, j["steps"] = o.steps;
  const BenchRow* base = baseline(r);
  for (auto& row : r.rows) {
    nlohmann::json jr = {{"schedule", row.schedule},
                         {"chunks", row.chunks},
                         {"tokens_per_s", row.tokens_per_s},
                         {"step_s", row.step_s},
                         {"bubble_measured", row.bubble_measured},
                         {"bubble_simulated", row.bubble_simulated},
                         {"peak_stash_bytes", row.stage_peak_stash}};
    if (base) {
      jr["throughput_vs_1f1b"] = row.tokens_per_s / base->tokens_per_s;
      jr["stash_stage0_vs_1f1b"] = double(row.stage_peak_stash[0]) / double(base->stage_peak_stash[0]);
    }
    for (auto& m : row.stage_memory) {
      nlohmann::json js;
      for (int c = 0; c < kNumMemCategories; ++c) js[mem_category_name(MemCategory(c))] = m.peak[c];
      js["total"] = m.total_peak;
      jr["peak_bytes"].push_back(js);
    }
    j["results"].push_back(jr);
  }
  std::ofstream f(path);
  SF_CHECK(f.good(), "cannot write bench results to '", path, "'");
  f << j.dump(2) << "\n";
}

}  // namespace stateflow
