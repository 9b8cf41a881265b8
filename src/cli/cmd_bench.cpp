// `stateflow bench`
#include <algorithm>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "cli/common.h"
#include "pipeline/chunk_partition.h"
#include "train/bench.h"
#include "train/bench_depth.h"
#include "train/cost_calibration.h"
#include "train/planner.h"

namespace stateflow::cli {

template <class T>
static std::vector<T> comma_list(const std::string& text) {
  std::vector<T> out;
  std::stringstream ss(text);
  for (std::string s; std::getline(ss, s, ',');) {
    if constexpr (std::is_same_v<T, std::string>) {
      out.push_back(s);
    } else {
      size_t used = 0;
      int v = 0;
      try {
        v = std::stoi(s, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      SF_CHECK(used == s.size() && v >= 1, "'", text, "': expected comma-separated positive integers, e.g. 2,4,8");
      out.push_back(T(v));
    }
  }
  return out;
}

// --alphas: non-negative numbers, comma-separated.
static std::vector<double> alpha_list(const std::string& text) {
  std::vector<double> out;
  std::stringstream ss(text);
  for (std::string s; std::getline(ss, s, ',');) {
    size_t used = 0;
    double v = -1;
    try {
      v = std::stod(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    SF_CHECK(used == s.size() && v >= 0 && v <= 2, "--alphas '", text,
             "': expected comma-separated alphas from 0 (equal chunks) to 2, e.g. 0,0.5,1");
    out.push_back(v);
  }
  return out;
}

// --chunks auto: stateflow at the planner's N with equal, balanced and the best alpha's chunks,
// the --schedules baselines at this --microbatches and --recompute, and the best that the
// planner finds for each schedule over every M and recompute (the same search for all).
static std::vector<PlannedRun> planned_runs(const BenchOptions& o, const PipelineOptions& pipe,
                                            const std::vector<std::string>& schedules, double memory_bytes,
                                            bool every_alpha, const std::vector<double>& alphas,
                                            const std::vector<int>& chunk_counts, AutoChunks& a) {
  PlanSpace space = pipe.auto_chunk_space(o.model, o.dtype, o.device, o.batch, o.seq_len, o.recompute, memory_bytes);
  space.schedules = {"stateflow"}, space.alphas = alphas, space.chunks = chunk_counts;
  a = choose_chunks(space, pipe.profile_dir.empty() ? default_profile_dir() : pipe.profile_dir, std::cout,
                    pipe.cost_profile);
  const std::vector<PassCosts> stages = a.costs.stage_costs(o.model, o.stages);
  std::vector<PlannedRun> runs;
  auto add = [&](const std::string& label, Plan p) {
    for (PlannedRun& r : runs)
      if (r.schedule == p.schedule && r.microbatches == p.microbatches && r.recompute == p.recompute &&
          r.chunk_lengths == p.chunk_lengths) {
        r.label += " = " + label;
        return;
      }
    predict_plan(a.costs, stages, space, p);
    const int64_t peak = *std::max_element(p.stage_peak_total.begin(), p.stage_peak_total.end());
    runs.push_back({label, p.schedule, p.microbatches, p.recompute, p.chunk_lengths, p.step_s, peak});
  };
  const double b = double(o.batch / o.microbatches);
  for (auto [label, alpha] : {std::pair<std::string, double>{"equal", 0.0}, {"balanced", 1.0},
                              {cat("best alpha ", a.plan.alpha), a.plan.alpha}}) {
    Plan p = a.plan;
    p.alpha = alpha;
    p.chunk_lengths = alpha_partition(unit_cost(stages, o.recompute), b, o.seq_len, a.plan.chunks, alpha, space.multiple);
    if (!p.chunk_lengths.empty()) add(label, p);
  }
  // The brute force the choice is judged against: every alpha of the grid at that N, or at every
  // N the planner chose from when --chunk-counts names them.
  for (int N : chunk_counts.empty() ? std::vector<int>{a.plan.chunks} : chunk_counts)
    for (double alpha : !every_alpha ? std::vector<double>{} : alphas.empty() ? partition_alphas() : alphas) {
      Plan p = a.plan;
      p.alpha = alpha;
      p.chunk_lengths = alpha_partition(unit_cost(stages, o.recompute), b, o.seq_len, N, alpha, space.multiple);
      if (!p.chunk_lengths.empty()) add(cat("N ", N, " alpha ", alpha), p);
    }
  for (const std::string& name : schedules) {
    if (parse_schedule_kind(name) == ScheduleKind::StateFlow) continue;
    Plan p;
    p.schedule = name, p.microbatches = o.microbatches, p.recompute = o.recompute, p.chunk_lengths = {o.seq_len};
    add(name, p);
    space.schedules.push_back(name);
  }
  // Every schedule tuned over the same space: M, recompute, and stateflow's N and alpha.
  space.microbatches.clear(), space.recompute = {false, true};
  const std::vector<Plan> ranked = search_plans(a.costs, space);
  print_plans(ranked, space, 10, std::cout);
  for (const std::string& name : space.schedules)
    if (const Plan* best = best_plan(ranked, name)) add("tuned " + name, *best);
  return runs;
}

// The planned runs' predictions again, on costs calibrated on the first run (its per-chunk times
// and step time: cost_calibration.h), as the online tuner would see them after one step.
static void print_calibrated(const BenchResult& r, const AutoChunks& a, std::ostream& os) {
  if (!r.report || r.rows.empty() || r.rows.front().oom) return;
  auto plan_of = [](const BenchRow& row) {
    Plan p;
    p.schedule = row.schedule, p.microbatches = row.microbatches, p.recompute = row.recompute;
    p.chunk_lengths = row.chunk_lengths;
    return p;
  };
  CostCalibration calibration(a.costs, a.space);
  calibration.add(plan_of(r.rows.front()), r.rows.front().costs, r.rows.front().step_s);
  os << cat("calibrated on the first run (", r.rows.front().label, "): costs refitted, ",
            calibration.space().message_s * 1e3, " ms per message between stages\n");
  char line[256];
  std::snprintf(line, sizeof line, "%-32s %4s %10s %10s %9s\n", "run", "N", "step s", "cal.pred", "meas/pred");
  os << line;
  for (const BenchRow& row : r.rows) {
    if (row.oom) continue;
    Plan p = plan_of(row);
    calibration.predict(p);
    std::snprintf(line, sizeof line, "%-32s %4d %10.4f %10.4f %9.3f\n", row.label.c_str(), row.chunks(), row.step_s,
                  p.step_s, row.step_s / p.step_s);
    os << line;
  }
}

void add_bench_command(CLI::App& root) {
  auto* app = root.add_subcommand(
      "bench",
      "Run schedules side by side on the same model, weights and batches: tokens/s, peak memory per stage (and per "
      "GPU from the driver), measured and simulated bubble; optionally a sweep over stateflow's chunk count and "
      "simulator predictions for deeper pipelines");
  auto opts = std::make_shared<BenchOptions>();
  auto model = std::make_shared<ModelOptions>();
  auto data = std::make_shared<DataOptions>();
  auto pipe = std::make_shared<PipelineOptions>();
  auto schedules = std::make_shared<std::string>("1f1b,stateflow");
  auto sweep = std::make_shared<std::string>();
  auto simulate_stages = std::make_shared<std::string>();
  auto simulate_models = std::make_shared<std::string>();
  auto gpu_memory_gib = std::make_shared<double>(141);
  auto json = std::make_shared<std::string>();
  auto predict_from = std::make_shared<std::string>();
  auto every_alpha = std::make_shared<bool>(false);
  auto alphas = std::make_shared<std::string>();
  auto chunk_counts = std::make_shared<std::string>();
  auto chosen = std::make_shared<AutoChunks>();  // --chunks auto
  pipe->stages = opts->stages, pipe->microbatches = opts->microbatches, pipe->chunks = 8;
  model->add(*app, "small", "f32");
  data->add(*app);
  pipe->add(*app);
  app->get_option("--schedule")->description("(unused by bench: see --schedules)");
  app->get_option("--chunks")->description("Chunks N per sequence for stateflow (1f1b and gpipe run whole sequences)");
  app->add_option("--schedules", *schedules, "Comma-separated schedules to compare (1f1b, stateflow, gpipe)")
      ->capture_default_str();
  app->add_option("--chunk-sweep", *sweep,
                  "Comma-separated chunk counts, e.g. 2,4,8,16,32: stateflow runs once per N (nearly equal chunks; "
                  "replaces --chunks) and the fastest N is marked");
  app->add_option("--batch", opts->batch, "Sequences per step")->capture_default_str();
  app->add_option("--seq-len", opts->seq_len, "Tokens per sequence")->capture_default_str();
  app->add_option("--warmup-steps", opts->warmup_steps, "Untimed steps first, per run")->capture_default_str();
  app->add_option("--steps", opts->steps, "Timed steps per run")->capture_default_str();
  app->add_option("--simulate-stages", *simulate_stages,
                  "Comma-separated stage counts, e.g. 4,8: predict step time, tokens/s, bubble and peak memory per "
                  "stage of every run at these depths with the simulator and this run's measured per-action costs "
                  "(from one stage too: its time is split between the blocks and the LM head by their FLOPs)");
  app->add_option("--simulate-model", *simulate_models,
                  "Comma-separated presets to predict for with --simulate-stages (e.g. gdn-3b,gdn-7b): the measured "
                  "per-block costs are scaled by the FLOP ratio and the activation bytes by the width ratio; "
                  "default: the measured model");
  app->add_option("--gpu-memory", *gpu_memory_gib,
                  "GiB of one GPU (141: H200): predictions whose peak per stage exceeds it are marked OOM")
      ->capture_default_str();
  app->add_flag("--breakdown", opts->breakdown,
               "After each run's timed steps, one more step with every layer call profiled: per layer kind and pass, "
               "the host's time to issue the work (launches, cuBLAS calls, allocations) against the device's time to "
               "run it back to back, in ms per unit (where host > device, the GPU waits for the host)");
  app->add_flag("--breakdown-overlapped", opts->breakdown_overlapped,
               "With --breakdown (implied): keep the side stream's work (weight gradients, reductions) beside the main "
               "stream while the parts are timed, so each part's device time is the main stream's, its waits for the "
               "side stream included: the step's critical path rather than each part's own work");
  app->add_flag("--rebuild-each-run", opts->rebuild_each_run,
               "Build the model anew for every run (schedule, N) instead of once per process (the runs then reshape "
               "one pipeline; the weights are never updated, so every run sees the same model either way)");
  app->add_flag("--every-alpha", *every_alpha,
                "With --chunks auto: also run stateflow at the chosen N with every alpha of the planner's grid (the "
                "brute force its choice is judged against)");
  app->add_option("--alphas", *alphas,
                 "With --chunks auto: the partition grid to search (and, with --every-alpha, to run), comma-separated "
                 "alphas, e.g. 0,1 (default: 0, 0.1, ..., 1, 1.25)");
  app->add_option("--chunk-counts", *chunk_counts,
                  "With --chunks auto: the chunk counts N the planner may choose from, comma-separated, e.g. 4,8 "
                  "(default: 2, 4, ..., 64 that fit the cut multiple); with --every-alpha, every alpha runs at each of "
                  "them (the brute force over the planner's whole grid)");
  app->add_option("--json", *json, "Also write the results (and predictions) as JSON to this file");
  app->add_option("--predict-from", *predict_from,
                  "Run nothing: read a run recorded with --json (e.g. on the GPU machine), print it, and predict "
                  "--simulate-stages / --simulate-model from its measured costs (model, batch, lengths and stages "
                  "come from the record)");
  app->callback([=]() {
    BenchOptions o = *opts;
    apply_common_options(o, *model, *data, *pipe);
    SF_CHECK(pipe->chunks_auto || (alphas->empty() && !*every_alpha && chunk_counts->empty()),
             "--alphas, --every-alpha and --chunk-counts choose runs of --chunks auto: add --chunks auto");
    if (pipe->chunks_auto) {
      SF_CHECK(sweep->empty() && predict_from->empty(), "--chunks auto plans its own runs: leave out --chunk-sweep "
                                                        "and --predict-from");
      o.planned = planned_runs(o, *pipe, comma_list<std::string>(*schedules),
                               o.device == Device::CPU ? 0 : *gpu_memory_gib * double(int64_t(1) << 30), *every_alpha,
                               alpha_list(*alphas), comma_list<int>(*chunk_counts), *chosen);
      o.chunk_lengths = o.planned.front().chunk_lengths;
    } else {
      o.chunk_lengths = pipe->resolve_chunks(o.seq_len);
    }
    if (o.breakdown_overlapped) o.breakdown = true;
    o.schedules = comma_list<std::string>(*schedules);
    o.chunk_sweep = comma_list<int>(*sweep);
    o.simulate_stages = comma_list<int>(*simulate_stages);
    SF_CHECK(*gpu_memory_gib > 0, "--gpu-memory must be positive (GiB)");
    o.gpu_memory_bytes = *gpu_memory_gib * double(int64_t(1) << 30);
    BenchResult r;
    if (!predict_from->empty()) {
      SF_CHECK(!o.simulate_stages.empty(), "--predict-from needs --simulate-stages (e.g. 4,8): it only predicts");
      std::ifstream f(*predict_from);
      SF_CHECK(f.good(), "cannot read the bench record '", *predict_from, "'");
      nlohmann::json recorded = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
      SF_CHECK(!recorded.is_discarded(), "bench record '", *predict_from, "' is not valid JSON");
      r = bench_from_json(recorded, o, *predict_from);
      std::cout << "recorded run " << *predict_from << " (nothing was run now):\n";
    }
    for (const std::string& name : comma_list<std::string>(*simulate_models))
      o.simulate_models.push_back(model_preset(name));
    if (o.simulate_models.empty()) o.simulate_models.push_back(o.model);
    check_depth_targets(o);
    if (predict_from->empty()) r = run_bench(o);
    print_bench(r, o, std::cout);
    if (!o.planned.empty()) print_calibrated(r, *chosen, std::cout);
    print_layer_breakdown(r, std::cout);
    nlohmann::json predictions = nlohmann::json::array();
    for (const ModelConfig& target : o.simulate_stages.empty() ? std::vector<ModelConfig>{} : o.simulate_models) {
      DepthPredictions p = predict_depths(r, o, target);
      if (r.report) print_depth_predictions(p, o, std::cout);
      predictions.push_back(depth_predictions_json(p, o));
    }
    if (!json->empty() && r.report) {
      nlohmann::json j = bench_json(r, o);
      j["predictions"] = predictions;
      std::ofstream f(*json);
      SF_CHECK(f.good(), "cannot write bench results to '", *json, "'");
      f << j.dump(2) << "\n";
    }
  });
}

}  // namespace stateflow::cli
