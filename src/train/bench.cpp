#include "train/bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <ostream>

#include "core/op_scope.h"
#include "pipeline/chunking.h"
#include "train/device_memory.h"

namespace stateflow {

int64_t BenchRow::peak_bytes() const {
  int64_t most = 0;
  for (const MemorySnapshot& m : stage_memory) most = std::max(most, m.total_peak);
  return most;
}

// The simulator's cost table from the timelines of the timed steps: mean time of every
// (stage, chunk) forward and backward, and of a send per chunk. The whole run is local, or
// gathered over processes.
static CostTable measured_costs(const std::vector<PipelineStepResult>& steps, Pipeline& pipe, int P, int N) {
  CostTable t;
  t.forward_time.assign(P, std::vector<double>(N, 0.0));
  t.backward_time.assign(P, std::vector<double>(N, 0.0));
  t.send_time.assign(N, 0.0);
  std::vector<std::vector<int>> nf(P, std::vector<int>(N, 0)), nb(P, std::vector<int>(N, 0));
  std::vector<int> ns(N, 0);
  for (auto& step : steps)
    for (auto& stage : step.stages)
      for (const TimedAction& a : stage.timeline) {
        const int r = a.action.stage, c = a.action.chunk;
        if (a.action.op == Op::Forward) t.forward_time[r][c] += a.end - a.start, ++nf[r][c];
        if (a.action.op == Op::Backward) t.backward_time[r][c] += a.end - a.start, ++nb[r][c];
        if (a.action.op == Op::Send) t.send_time[c] += a.end - a.start, ++ns[c];
      }
  auto mean = [&](double sum, int n) { return pipe.max_over_processes(n ? sum / n : 0.0); };
  for (int c = 0; c < N; ++c) {
    for (int r = 0; r < P; ++r) {
      t.forward_time[r][c] = mean(t.forward_time[r][c], nf[r][c]);
      t.backward_time[r][c] = mean(t.backward_time[r][c], nb[r][c]);
    }
    t.send_time[c] = mean(t.send_time[c], ns[c]);
  }
  return t;
}

// Every stage's peaks, gathered to every process (each process knows its own stages).
static void gather_memory(Pipeline& pipe, int P, BenchRow& row) {
  row.stage_memory.assign(P, MemorySnapshot{});
  row.stage_peak_stash.assign(P, 0);
  std::vector<MemorySnapshot> local(P);
  std::vector<int64_t> local_stash(P, 0);
  for (Stage* s : pipe.stages())
    local[s->rank()] = s->tracker().snapshot(), local_stash[s->rank()] = s->executor().peak_stash_bytes();
  for (int r = 0; r < P; ++r) {
    for (int c = 0; c < kNumMemCategories; ++c)
      row.stage_memory[r].peak[c] = int64_t(pipe.max_over_processes(double(local[r].peak[c])));
    row.stage_memory[r].total_peak = int64_t(pipe.max_over_processes(double(local[r].total_peak)));
    row.stage_peak_stash[r] = int64_t(pipe.max_over_processes(double(local_stash[r])));
  }
}

static void keep_max(std::vector<int64_t>& most, const std::vector<int64_t>& now) {
  most.resize(std::max(most.size(), now.size()), 0);
  for (size_t i = 0; i < now.size(); ++i) most[i] = std::max(most[i], now[i]);
}

// One schedule at one chunking: warm-up, timed steps, measurements. `pipe` is the pipeline of
// the runs before: it is reshaped for this one, so the model is built (and its weights drawn)
// once per process; the weights stay those it was built with, as a bench never updates them.
// It is built when there is none yet (or every time with --rebuild-each-run), and dropped
// after a run that ran out of memory (a failed step leaves it aborted). When this returns,
// the pipeline's cached device blocks are back with the driver: each run starts from the
// weights alone, as a pipeline of its own would.
static BenchRow run_one(const BenchOptions& o, PipelineConfig pc, const std::vector<Batch>& batches,
                        std::unique_ptr<Pipeline>& pipe, bool& report) {
  BenchRow row;
  row.schedule = kind_name(pc.schedule);
  row.chunk_lengths = pc.chunk_lengths;
  row.microbatches = pc.microbatches, row.recompute = pc.recompute;
  try {
    if (pipe && !o.rebuild_each_run) {
      pipe->reshape(pc);
    } else {
      pipe.reset();  // the old model's memory first
      pipe = o.make_pipeline(pc, o.transport);
    }
    report = is_reporting_rank(*pipe);
    std::vector<PipelineStepResult> timed;
    double seconds = 0;
    DeviceGraphCounts graphs_before;
    auto graph_counts = [&] {
      return pc.device == Device::CPU ? DeviceGraphCounts{} : device_backend(pc.device).graph_counts();
    };
    for (int i = 0; i < o.warmup_steps + o.steps; ++i) {
      if (i == o.warmup_steps) {
        for (Stage* s : pipe->stages()) s->tracker().reset_peaks(), s->executor().reset_peak_stash();
        graphs_before = graph_counts();
      }
      pipe->zero_grads();
      auto t0 = std::chrono::steady_clock::now();
      PipelineStepResult r = pipe->forward_backward(batches[i]);
      if (i >= o.warmup_steps) {
        seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        row.bubble_measured += r.bubble_fraction / o.steps;
        row.loss += r.loss / o.steps;
        double host_issue = 0;  // the slowest stage's
        for (const StageStepResult& st : r.stages) host_issue = std::max(host_issue, st.host_issue_s);
        row.host_issue_s += host_issue / o.steps;
        timed.push_back(std::move(r));
        keep_max(row.gpu_used_bytes, gpu_used_bytes());
      }
    }
    if (o.breakdown) {
      for (Stage* s : pipe->stages()) s->executor().set_profile(std::make_unique<LayerProfile>(pc.device));
      pipe->zero_grads();
      op_timer_keeps_overlap() = o.breakdown_overlapped;
      try {
        pipe->forward_backward(batches.back());
      } catch (...) {
        op_timer_keeps_overlap() = false;
        throw;
      }
      op_timer_keeps_overlap() = false;
      row.op_timings_overlapped = o.breakdown_overlapped;
      row.layer_timings.assign(pc.stages, {});
      row.op_timings.assign(pc.stages, {});
      for (Stage* s : pipe->stages()) {
        row.layer_timings[s->rank()] = s->executor().profile()->timings();
        row.op_timings[s->rank()] = s->executor().profile()->op_timings();
        s->executor().set_profile(nullptr);
      }
      row.units_per_stage = pc.microbatches * row.chunks();
    }
    row.step_s = seconds / o.steps;
    row.host_issue_s = pipe->max_over_processes(row.host_issue_s);
    const DeviceGraphCounts graphs = graph_counts();
    const double launched = double(graphs.launched - graphs_before.launched);
    row.graphs_per_step = launched / o.steps;
    row.nodes_per_graph = launched > 0 ? double(graphs.nodes - graphs_before.nodes) / launched : 0;
    row.tokens_per_s = double(o.batch * o.seq_len) * o.steps / seconds;
    row.costs = measured_costs(timed, *pipe, pc.stages, row.chunks());
    row.bubble_simulated = simulate(make_schedule(pc.schedule, pc.stages, pc.microbatches, row.chunks()), row.costs)
                               .bubble_fraction;
    gather_memory(*pipe, pc.stages, row);
    pipe->release_cached_device_memory();
  } catch (const OutOfMemoryError& e) {
    pipe.reset();
    const std::string what = e.what();
    BenchRow failed;  // nothing measured survives
    failed.schedule = row.schedule, failed.chunk_lengths = row.chunk_lengths;
    failed.microbatches = row.microbatches, failed.recompute = row.recompute;
    failed.oom = true, failed.oom_message = what.substr(0, what.find('\n'));
    row = std::move(failed);
  }
  return row;
}

// One line on stderr per finished run, as it finishes: a long matrix shows life, and a bench
// stopped by a timeout leaves what it measured in the log.
static void print_progress(const BenchRow& row, size_t done, size_t total, double run_s, double elapsed_s) {
  char line[320];
  if (row.oom)
    std::snprintf(line, sizeof line, "bench [%zu/%zu] %s N=%d: OOM (run %.1f s, elapsed %.1f s): ", done, total,
                  row.schedule.c_str(), row.chunks(), run_s, elapsed_s);
  else if (row.host_issue_s > 0)  // a GPU: how much of the step the host's launches took, and its graphs
    std::snprintf(line, sizeof line,
                  "bench [%zu/%zu] %s N=%d: %.0f tokens/s, %.4f s/step (host issued it in %.4f s; %.0f graphs a "
                  "step, %.0f nodes each), loss %.6f (run %.1f s, elapsed %.1f s)",
                  done, total, row.schedule.c_str(), row.chunks(), row.tokens_per_s, row.step_s, row.host_issue_s,
                  row.graphs_per_step, row.nodes_per_graph, row.loss, run_s, elapsed_s);
  else
    std::snprintf(line, sizeof line,
                  "bench [%zu/%zu] %s N=%d: %.0f tokens/s, %.4f s/step, loss %.6f (run %.1f s, elapsed %.1f s)", done,
                  total, row.schedule.c_str(), row.chunks(), row.tokens_per_s, row.step_s, row.loss, run_s, elapsed_s);
  std::cerr << line << (row.oom ? row.oom_message : "") << std::endl;
}

BenchResult run_bench(const BenchOptions& o) {
  SF_CHECK(o.steps >= 1 && o.warmup_steps >= 0, "bench: --steps must be >= 1 and --warmup-steps >= 0");
  DataConfig dc = o.data;
  if (dc.kind == "recall" && dc.vocab_size == 0) dc.vocab_size = o.model.vocab_size;
  auto data = make_data_source(dc);
  std::vector<Batch> batches;
  for (int i = 0; i < o.warmup_steps + o.steps; ++i) batches.push_back(data->next(o.batch, o.seq_len));

  // Every run first (schedule, chunk lengths), so that progress lines can count them.
  std::vector<PipelineConfig> runs;
  PipelineConfig base;
  base.model = o.model, base.dtype = o.dtype, base.device = o.device, base.stages = o.stages;
  base.microbatches = o.microbatches, base.timeout_s = o.timeout_s, base.recompute = o.recompute;
  base.split_sms = o.split_sms;
  for (const PlannedRun& p : o.planned) {
    PipelineConfig pc = base;
    pc.schedule = parse_schedule_kind(p.schedule);
    pc.microbatches = p.microbatches, pc.recompute = p.recompute, pc.chunk_lengths = p.chunk_lengths;
    validate_chunk_lengths(pc.chunk_lengths, o.seq_len);
    runs.push_back(pc);
  }
  for (const std::string& name : o.planned.empty() ? o.schedules : std::vector<std::string>{}) {
    PipelineConfig pc = base;
    pc.schedule = parse_schedule_kind(name);
    std::vector<std::vector<int64_t>> chunkings{{o.seq_len}};
    if (pc.schedule == ScheduleKind::StateFlow) {
      chunkings = {o.chunk_lengths};
      if (!o.chunk_sweep.empty()) chunkings.clear();
      for (int n : o.chunk_sweep) chunkings.push_back(even_chunk_lengths(o.seq_len, n));
    }
    for (auto& lengths : chunkings) {
      validate_chunk_lengths(lengths, o.seq_len);
      pc.chunk_lengths = lengths;
      runs.push_back(pc);
    }
  }
  BenchResult result;
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  std::unique_ptr<Pipeline> pipe;  // shared by the runs (run_one)
  for (const PipelineConfig& pc : runs) {
    const auto run_start = Clock::now();
    result.rows.push_back(run_one(o, pc, batches, pipe, result.report));
    if (!o.planned.empty()) {
      const PlannedRun& p = o.planned[result.rows.size() - 1];
      result.rows.back().label = p.label, result.rows.back().predicted_step_s = p.predicted_step_s;
      result.rows.back().predicted_peak_bytes = p.predicted_peak_bytes;
    }
    const auto end = Clock::now();
    if (result.report)
      print_progress(result.rows.back(), result.rows.size(), runs.size(),
                     std::chrono::duration<double>(end - run_start).count(),
                     std::chrono::duration<double>(end - start).count());
  }
  if (!o.chunk_sweep.empty()) {
    BenchRow* best = nullptr;
    for (auto& row : result.rows)
      if (row.schedule == "stateflow" && !row.oom && (!best || row.tokens_per_s > best->tokens_per_s)) best = &row;
    if (best) best->best = true;
  }
  return result;
}

const BenchRow* baseline(const BenchResult& r) {
  for (auto& row : r.rows)
    if (row.schedule == "1f1b" && !row.oom) return &row;
  return nullptr;
}

void print_bench(const BenchResult& r, const BenchOptions& o, std::ostream& os) {
  if (!r.report) return;
  os << "model " << o.model.name << " (" << o.model.num_parameters() << " parameters, " << dtype_name(o.dtype)
     << " on " << device_name(o.device) << "), batch " << o.batch << " x " << o.seq_len << " tokens, P=" << o.stages
     << ", M=" << o.microbatches << ", " << o.transport << " transport, "
     << (o.recompute ? "full recomputation, " : "") << o.warmup_steps << " warm-up + " << o.steps << " timed steps\n";
  const BenchRow* base = baseline(r);
  auto ratio = [&](double x, double y) { return base && y > 0 ? x / y : 0.0; };
  char line[512];
  std::snprintf(line, sizeof line, "%-10s %4s %11s %7s %9s %9s %9s %12s %7s %12s %12s\n", "schedule", "N", "tokens/s",
                "x1f1b", "step s", "bubble", "bub.sim", "peak/stage", "x1f1b", "stash s0", "driver/GPU");
  os << line;
  for (auto& row : r.rows) {
    if (row.oom) {
      std::snprintf(line, sizeof line, "%-10s %4d %11s  ", row.schedule.c_str(), row.chunks(), "OOM");
      os << line << row.oom_message << "\n";
      continue;
    }
    const int64_t driver = row.gpu_used_bytes.empty()
                               ? 0
                               : *std::max_element(row.gpu_used_bytes.begin(), row.gpu_used_bytes.end());
    std::snprintf(line, sizeof line, "%-10s %4d %11.0f %7.3f %9.4f %9.3f %9.3f %12s %7.3f %12s %12s%s\n",
                  row.schedule.c_str(), row.chunks(), row.tokens_per_s,
                  ratio(row.tokens_per_s, base ? base->tokens_per_s : 0), row.step_s, row.bubble_measured,
                  row.bubble_simulated, format_bytes(row.peak_bytes()).c_str(),
                  ratio(double(row.peak_bytes()), base ? double(base->peak_bytes()) : 0),
                  format_bytes(row.stage_peak_stash[0]).c_str(), driver ? format_bytes(driver).c_str() : "-",
                  row.best ? "  <- best N" : "");
    os << line;
  }
  os << "(x1f1b: ratio to the 1f1b row; peak/stage: the allocator's peak total on the fullest stage; driver/GPU: "
        "cudaMemGetInfo's bytes in use on the fullest GPU, most seen after a timed step)\n";
  if (!r.rows.empty() && !r.rows.front().label.empty()) {
    os << "planned runs (--chunks auto): measured against the planner's prediction from the cost profile\n";
    std::snprintf(line, sizeof line, "%-32s %-10s %3s %4s %4s %11s %10s %10s %9s %12s %12s %9s\n", "run", "schedule",
                  "M", "rec", "N", "tokens/s", "step s", "pred s", "meas/pred", "peak/stage", "pred peak", "meas/pred");
    os << line;
    for (const BenchRow& row : r.rows) {
      if (row.oom) {
        os << cat(row.label, ": OOM (predicted peak/stage ", format_bytes(row.predicted_peak_bytes), ")\n");
        continue;
      }
      std::snprintf(line, sizeof line, "%-32s %-10s %3d %4s %4d %11.0f %10.4f %10.4f %9.3f %12s %12s %9.3f\n",
                    row.label.c_str(), row.schedule.c_str(), row.microbatches, row.recompute ? "full" : "-",
                    row.chunks(), row.tokens_per_s, row.step_s, row.predicted_step_s,
                    row.predicted_step_s > 0 ? row.step_s / row.predicted_step_s : 0.0,
                    format_bytes(row.peak_bytes()).c_str(), format_bytes(row.predicted_peak_bytes).c_str(),
                    row.predicted_peak_bytes > 0 ? double(row.peak_bytes()) / double(row.predicted_peak_bytes) : 0.0);
      os << line;
      os << "  chunks " << format_chunk_lengths(row.chunk_lengths) << "\n";
    }
  }
  os << "peak bytes per stage by category:\n";
  for (auto& row : r.rows) {
    if (row.oom) continue;
    for (size_t s = 0; s < row.stage_memory.size(); ++s) {
      os << "  " << row.schedule << " N=" << row.chunks() << " stage " << s << ":";
      for (int c = 0; c < kNumMemCategories; ++c)
        if (row.stage_memory[s].peak[c])
          os << " " << mem_category_name(MemCategory(c)) << " " << format_bytes(row.stage_memory[s].peak[c]);
      os << " | total " << format_bytes(row.stage_memory[s].total_peak) << "\n";
    }
    for (size_t g = 0; g < row.gpu_used_bytes.size(); ++g)
      os << "  " << row.schedule << " N=" << row.chunks() << " GPU " << g << ": driver "
         << format_bytes(row.gpu_used_bytes[g]) << " in use\n";
  }
}

// Sums of one (kind, pass) over the layers of a stage.
struct KindTiming {
  std::string kind;
  Pass pass;
  int layers = 0, host_waits = 0;
  double host_s = 0, device_s = 0;
};

static std::vector<KindTiming> by_kind(const std::vector<LayerTiming>& timings) {
  std::vector<KindTiming> out;
  for (Pass pass : {Pass::Forward, Pass::Recompute, Pass::Backward})
    for (const LayerTiming& t : timings) {
      if (t.pass != pass) continue;
      auto it = std::find_if(out.begin(), out.end(), [&](auto& k) { return k.kind == t.kind && k.pass == pass; });
      if (it == out.end()) it = out.insert(out.end(), KindTiming{t.kind, pass});
      ++it->layers, it->host_waits += t.host_waits, it->host_s += t.host_s, it->device_s += t.device_s;
    }
  return out;
}

// Device ms per step by named part, largest first within each pass: which kernels the time of
// a chunking goes to (compare the rows of a chunk sweep).
static void print_op_breakdown(const BenchRow& row, std::vector<OpTiming> ops, std::ostream& os) {
  if (ops.empty()) return;
  std::stable_sort(ops.begin(), ops.end(), [](const OpTiming& a, const OpTiming& b) {
    return a.pass != b.pass ? a.pass < b.pass : a.device_s > b.device_s;
  });
  char line[256];
  os << "  parts of the layers' device work, " << row.schedule << " N=" << row.chunks()
     << " (ms per step; calls per step; an outer part includes its inner ones"
     << (row.op_timings_overlapped ? "; the main stream's time, side-stream work beside it and waits for it included"
                                   : "")
     << ")\n";
  std::snprintf(line, sizeof line, "    %-28s %-9s %8s %10s %10s\n", "part", "pass", "calls", "device ms", "us/call");
  os << line;
  for (const OpTiming& t : ops) {
    std::snprintf(line, sizeof line, "    %-28s %-9s %8d %10.3f %10.1f", t.name.c_str(), pass_name(t.pass), t.calls,
                  t.device_s * 1e3, t.calls ? t.device_s * 1e6 / t.calls : 0.0);
    os << line;
    if (t.boundaries > 0) {  // the rest: mostly the device's gaps at the part boundaries
      std::snprintf(line, sizeof line, "   (%.0f part boundaries a call: %.2f us each)", double(t.boundaries) / t.calls,
                    t.device_s * 1e6 / t.boundaries);
      os << line;
    }
    os << "\n";
  }
}

void print_layer_breakdown(const BenchResult& r, std::ostream& os) {
  if (!r.report) return;
  char line[256];
  for (const BenchRow& row : r.rows)
    for (size_t stage = 0; stage < row.layer_timings.size(); ++stage) {
      if (row.layer_timings[stage].empty()) continue;
      const double per_unit = 1e3 / row.units_per_stage;  // seconds summed over units -> ms per unit
      os << "layer breakdown, " << row.schedule << " N=" << row.chunks() << ", stage " << stage << " (ms per unit, "
         << row.units_per_stage << " units a step; host: issuing the work, device: running it back to back)\n";
      std::snprintf(line, sizeof line, "  %-12s %-9s %6s %10s %10s %10s\n", "layer", "pass", "layers", "host ms",
                    "device ms", "host-dev");
      os << line;
      double host[3] = {0, 0, 0}, device[3] = {0, 0, 0};
      for (const KindTiming& k : by_kind(row.layer_timings[stage])) {
        std::snprintf(line, sizeof line, "  %-12s %-9s %6d %10.3f %10.3f %10.3f%s\n", k.kind.c_str(),
                      pass_name(k.pass), k.layers, k.host_s * per_unit, k.device_s * per_unit,
                      (k.host_s - k.device_s) * per_unit, k.host_waits ? "  (host waited for the GPU)" : "");
        os << line;
        host[int(k.pass)] += k.host_s, device[int(k.pass)] += k.device_s;
      }
      for (Pass pass : {Pass::Forward, Pass::Recompute, Pass::Backward}) {
        const int p = int(pass);
        if (host[p] == 0 && device[p] == 0) continue;
        std::snprintf(line, sizeof line, "  %-12s %-9s %6s %10.3f %10.3f %10.3f\n", "all", pass_name(pass), "",
                      host[p] * per_unit, device[p] * per_unit, (host[p] - device[p]) * per_unit);
        os << line;
      }
      if (stage < row.op_timings.size()) print_op_breakdown(row, row.op_timings[stage], os);
    }
}

nlohmann::json bench_json(const BenchResult& r, const BenchOptions& o) {
  nlohmann::json j;
  j["model"] = o.model.to_json();
  j["parameters"] = o.model.num_parameters();
  j["dtype"] = dtype_name(o.dtype);
  j["device"] = device_name(o.device);
  j["batch"] = o.batch, j["seq_len"] = o.seq_len, j["stages"] = o.stages, j["microbatches"] = o.microbatches;
  j["transport"] = o.transport, j["sm_split"] = o.split_sms, j["recompute"] = o.recompute, j["warmup_steps"] = o.warmup_steps, j["steps"] = o.steps;
  j["results"] = nlohmann::json::array();
  const BenchRow* base = baseline(r);
  for (auto& row : r.rows) {
    nlohmann::json jr = {{"schedule", row.schedule}, {"chunks", row.chunks()}, {"chunk_lengths", row.chunk_lengths},
                         {"oom", row.oom}};
    if (!row.label.empty())
      jr.update({{"label", row.label},
                 {"microbatches", row.microbatches},
                 {"recompute", row.recompute},
                 {"predicted_step_s", row.predicted_step_s},
                 {"predicted_peak_bytes", row.predicted_peak_bytes}});
    if (row.oom) {
      jr["oom_message"] = row.oom_message;
      j["results"].push_back(jr);
      continue;
    }
    jr.update({{"best", row.best},
               {"tokens_per_s", row.tokens_per_s},
               {"step_s", row.step_s},
               {"host_issue_s", row.host_issue_s},
               {"graphs_per_step", row.graphs_per_step},
               {"nodes_per_graph", row.nodes_per_graph},
               {"loss", row.loss},
               {"bubble_measured", row.bubble_measured},
               {"bubble_simulated", row.bubble_simulated},
               {"peak_stash_bytes", row.stage_peak_stash},
               {"peak_bytes_max", row.peak_bytes()},
               {"gpu_used_bytes", row.gpu_used_bytes}});
    if (base) {
      jr["throughput_vs_1f1b"] = row.tokens_per_s / base->tokens_per_s;
      jr["peak_bytes_vs_1f1b"] = double(row.peak_bytes()) / double(base->peak_bytes());
      jr["stash_stage0_vs_1f1b"] = double(row.stage_peak_stash[0]) / double(base->stage_peak_stash[0]);
    }
    for (auto& m : row.stage_memory) {
      nlohmann::json js;
      for (int c = 0; c < kNumMemCategories; ++c) js[mem_category_name(MemCategory(c))] = m.peak[c];
      js["total"] = m.total_peak;
      jr["peak_bytes"].push_back(js);
    }
    for (size_t stage = 0; stage < row.layer_timings.size(); ++stage)
      for (const LayerTiming& t : row.layer_timings[stage])
        jr["layer_breakdown"].push_back({{"stage", stage}, {"layer", t.layer}, {"kind", t.kind},
                                         {"pass", pass_name(t.pass)}, {"calls", t.calls}, {"host_s", t.host_s},
                                         {"device_s", t.device_s}, {"host_waits", t.host_waits}});
    for (size_t stage = 0; stage < row.op_timings.size(); ++stage)
      for (const OpTiming& t : row.op_timings[stage])
        jr["op_breakdown"].push_back({{"stage", stage}, {"part", t.name}, {"pass", pass_name(t.pass)},
                                      {"calls", t.calls}, {"device_s", t.device_s}, {"boundaries", t.boundaries}});
    jr["measured_costs"] = {{"forward_s", row.costs.forward_time},
                            {"backward_s", row.costs.backward_time},
                            {"send_s", row.costs.send_time}};
    j["results"].push_back(jr);
  }
  return j;
}

BenchResult bench_from_json(const nlohmann::json& j, BenchOptions& o, const std::string& where) {
  try {
    o.model = ModelConfig::from_json(j.at("model"));
    o.dtype = parse_dtype(j.at("dtype").get<std::string>());
    o.device = parse_device(j.at("device").get<std::string>());
    o.batch = j.at("batch").get<int64_t>(), o.seq_len = j.at("seq_len").get<int64_t>();
    o.stages = j.at("stages").get<int>(), o.microbatches = j.at("microbatches").get<int>();
    o.transport = j.at("transport").get<std::string>(), o.recompute = j.at("recompute").get<bool>();
    o.warmup_steps = j.at("warmup_steps").get<int>(), o.steps = j.at("steps").get<int>();
    BenchResult r;
    for (const nlohmann::json& jr : j.at("results")) {
      BenchRow row;
      row.schedule = jr.at("schedule").get<std::string>();
      row.chunk_lengths = jr.at("chunk_lengths").get<std::vector<int64_t>>();
      row.oom = jr.at("oom").get<bool>();
      if (row.oom) {
        row.oom_message = jr.at("oom_message").get<std::string>();
        r.rows.push_back(std::move(row));
        continue;
      }
      row.best = jr.at("best").get<bool>();
      row.tokens_per_s = jr.at("tokens_per_s").get<double>(), row.step_s = jr.at("step_s").get<double>();
      // older records: not measured
      row.host_issue_s = jr.value("host_issue_s", 0.0), row.graphs_per_step = jr.value("graphs_per_step", 0.0);
      row.nodes_per_graph = jr.value("nodes_per_graph", 0.0);
      row.bubble_measured = jr.at("bubble_measured").get<double>();
      row.bubble_simulated = jr.at("bubble_simulated").get<double>();
      row.stage_peak_stash = jr.at("peak_stash_bytes").get<std::vector<int64_t>>();
      row.gpu_used_bytes = jr.at("gpu_used_bytes").get<std::vector<int64_t>>();
      for (const nlohmann::json& js : jr.at("peak_bytes")) {
        MemorySnapshot m;
        // Records made before the kv_prefix category have no such key: they had none.
        for (int c = 0; c < kNumMemCategories; ++c)
          m.peak[c] = MemCategory(c) == MemCategory::KvPrefix ? js.value(mem_category_name(MemCategory(c)), int64_t(0))
                                                              : js.at(mem_category_name(MemCategory(c))).get<int64_t>();
        m.total_peak = js.at("total").get<int64_t>();
        row.stage_memory.push_back(m);
      }
      const nlohmann::json& costs = jr.at("measured_costs");
      row.costs.forward_time = costs.at("forward_s").get<std::vector<std::vector<double>>>();
      row.costs.backward_time = costs.at("backward_s").get<std::vector<std::vector<double>>>();
      row.costs.send_time = costs.at("send_s").get<std::vector<double>>();
      SF_CHECK(int(row.stage_memory.size()) == o.stages && int(row.stage_peak_stash.size()) == o.stages &&
                   int(row.costs.forward_time.size()) == o.stages && int(row.costs.backward_time.size()) == o.stages,
               "bench record ", where, ": a ", row.schedule, " row does not hold one entry per stage (", o.stages,
               ")");
      r.rows.push_back(std::move(row));
    }
    return r;
  } catch (const nlohmann::json::exception& e) {
    fail("bench record ", where, " is not the JSON of `stateflow bench --json` (", e.what(),
         "); record one with --json FILE");
  }
}

}  // namespace stateflow
