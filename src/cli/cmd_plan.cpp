// `stateflow plan`
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/allocator.h"
#include "core/error.h"
#include "model/device_ops.h"
#include "model/flops.h"
#include "model/mixer.h"
#include "pipeline/check.h"
#include "pipeline/lower.h"
#include "pipeline/partition.h"
#include "pipeline/simulate.h"
#include "train/cost_profile.h"
#include "train/planner.h"

namespace stateflow::cli {

namespace {

// Per stage: its blocks, FLOPs per token (the LM head on the last), parameters and boundary
// state per sequence, from the mixer registry; printed, and returned as the simulator's costs
// (a chunk's share of a sequence; the busiest stage's forward of one sequence = 1).
CostTable model_costs(const ModelConfig& m, int P, int N, int64_t seq_len) {
  const std::vector<std::string> stages = stage_blocks(m, P);
  const double head = double(m.d_model) * double(m.vocab_size);
  std::vector<double> fwd(P), bwd(P);
  std::printf("model %s: pattern %s, %lld parameters; stages cut %s; FLOPs per token of a %lld-token sequence\n",
              m.name.c_str(), m.pattern.c_str(), (long long)m.num_parameters(),
              m.has_stage_cuts() ? "where the pattern has '|'" : "evenly by cost", (long long)seq_len);
  std::printf("%6s %-16s %16s %16s %20s\n", "stage", "blocks", "fwd MFLOP/token", "bwd MFLOP/token",
              "state/sequence");
  for (int r = 0; r < P; ++r) {
    int64_t state_bytes = 0;
    bool grows = false;
    for (char letter : stages[r]) {
      const BlockFlops f = block_flops_per_token(m, letter, seq_len);
      fwd[r] += f.forward(), bwd[r] += f.backward();
      for (const StateTensorSpec& t : mixer_for_letter(letter).boundary_state(m)) {
        state_bytes += shape_numel(t.shape) * int64_t(dtype_size(t.device_dtype));
        grows = grows || t.grows_with_chunks;
      }
    }
    if (r == P - 1) fwd[r] += 2 * head, bwd[r] += 4 * head;
    std::printf("%6d %-16s %16.4g %16.4g %17s%s\n", r, stages[r].c_str(), fwd[r] / 1e6, bwd[r] / 1e6,
                format_bytes(state_bytes).c_str(), grows ? " (+ grows with the prefix)" : "");
  }
  const double busiest = *std::max_element(fwd.begin(), fwd.end());
  CostTable t = uniform_costs(P, N, 0, 0, int64_t(1) << 20);
  for (int r = 0; r < P; ++r)
    for (int c = 0; c < N; ++c) t.forward_time[r][c] = fwd[r] / busiest / N, t.backward_time[r][c] = bwd[r] / busiest / N;
  return t;
}

struct PlanOptions {
  std::string schedule = "stateflow";
  int stages = 4, microbatches = 4, chunks = 4;
  bool dump = false, lowered = false;
  std::string trace;
  std::string preset, config_path, pattern;
  int64_t seq_len = 4096;
  // --auto
  bool automatic = false;
  int64_t batch = 8, multiple = 0;
  std::string dtype = "f32", device = "cpu", recompute = "both", profile_dir = default_profile_dir(), write_plan;
  std::string cost_profile;  // a recorded profile instead of profiling here
  bool shared_gpu = false, sm_split = false, longest = false;
  int64_t longest_limit = int64_t(1) << 22;
  double memory_gib = -1;
  int top = 15;
};

// --longest-seq-len: per schedule, the longest sequence that fits, and each against stateflow's.
void print_longest(const CostModel& costs, const PlanSpace& space, int64_t limit) {
  std::cout << "PREDICTED longest sequence that fits " << format_bytes(int64_t(space.memory_bytes))
            << " per device (multiples of " << space.multiple << " tokens, searched up to " << limit << "):\n";
  int64_t sf = 0;
  for (const std::string& schedule : space.schedules) {
    const int64_t T = longest_fitting_seq_len(costs, space, schedule, limit);
    if (schedule == "stateflow") sf = T;
    std::cout << "  " << schedule << ": " << (T ? std::to_string(T) + " tokens" : std::string("nothing fits"));
    if (schedule != "stateflow" && sf && T) std::cout << " (stateflow's is " << double(sf) / double(T) << "x)";
    std::cout << (T == limit / space.multiple * space.multiple ? " (the search's limit: --max-seq-len)" : "") << "\n";
  }
}

// `plan --auto`: profile (or the cached profile), search, print, and say how to run the best.
void plan_automatically(const PlanOptions& o, const CLI::App& app) {
  SF_CHECK(o.seq_len >= 1, "--seq-len ", o.seq_len, " must be >= 1");
  SF_CHECK(o.batch >= 1, "--batch must be at least 1");
  SF_CHECK(o.recompute == "none" || o.recompute == "full" || o.recompute == "both", "--recompute '", o.recompute,
           "': use none, full or both");
  SF_CHECK(o.top >= 1, "--top must be at least 1");
  PlanSpace space;
  space.model = resolve_model_config(o.preset.empty() ? "tiny" : o.preset, o.config_path, o.pattern);
  space.dtype = parse_dtype(o.dtype);
  space.device = parse_device(o.device);
  space.stages = o.stages, space.batch = o.batch, space.seq_len = o.seq_len;
  if (app.count("--schedule")) space.schedules = {o.schedule};
  if (app.count("--microbatches")) space.microbatches = {o.microbatches};
  if (app.count("--chunks")) space.chunks = {o.chunks};
  if (o.recompute != "both") space.recompute = {o.recompute == "full"};
  space.multiple = o.multiple > 0 ? o.multiple : default_chunk_multiple(space.model, space.device);
  const double gib = o.memory_gib >= 0 ? o.memory_gib : space.device == Device::CPU ? 0 : 141;
  space.memory_bytes = gib * double(int64_t(1) << 30);
  SF_CHECK(!(o.shared_gpu && o.sm_split), "--shared-gpu and --sm-split are two ways of sharing one GPU: give one");
  SF_CHECK(!o.sm_split || (space.device == Device::CUDA && space.stages > 1),
           "--sm-split plans stages side by side on parts of one GPU: it needs --device cuda and --stages 2 or more");
  space.shared_device = o.shared_gpu;
  space.split_sms = o.sm_split;
  CostModel costs;
  if (!o.cost_profile.empty()) {
    costs = recorded_cost_model(o.cost_profile, profile_options(space), std::cout);
  } else {
    init_device(space.device);
    costs = cached_cost_model(profile_options(space), o.profile_dir, std::cout);
  }
  if (o.longest) {
    // Which schedule trains the longest sequences: the stateflow row first, the others beside it.
    std::stable_partition(space.schedules.begin(), space.schedules.end(),
                          [](const std::string& s) { return s == "stateflow"; });
    return print_longest(costs, space, o.longest_limit);
  }
  const std::vector<Plan> ranked = search_plans(costs, space);
  print_plans(ranked, space, o.top, std::cout);
  SF_CHECK(!ranked.empty() && ranked.front().fits, "no configuration fits in ", format_bytes(int64_t(space.memory_bytes)),
           " per device: more --stages, a shorter --seq-len or a smaller --batch");
  const Plan& best = ranked.front();
  const std::string model_args = !o.config_path.empty() ? " --config " + o.config_path
                                 : " --preset " + (o.preset.empty() ? std::string("tiny") : o.preset);
  std::cout << "chosen: stateflow train" << model_args << (o.pattern.empty() ? "" : " --pattern \"" + o.pattern + "\"")
            << " --device " << o.device << " --stages " << o.stages << " --batch " << o.batch << " --seq-len "
            << o.seq_len << " " << plan_arguments(best) << "\n";
  if (!o.write_plan.empty()) {
    std::ofstream f(o.write_plan);
    SF_CHECK(f.good(), "cannot write the plan file '", o.write_plan, "'");
    f << plan_json(best, space).dump(2) << "\n";
    std::cout << "plan written to " << o.write_plan << " (--chunk-lengths " << o.write_plan << " runs its chunks)\n";
  }
}

}  // namespace

void add_plan_command(CLI::App& root) {
  auto* app = root.add_subcommand(
      "plan", "Show a schedule and what the simulator predicts for it: equal per-chunk costs, backward = 2x forward; "
              "with a model (--preset, --config or --pattern), each stage's cost from its blocks' FLOPs");
  auto o = std::make_shared<PlanOptions>();
  app->add_option("--schedule", o->schedule, "stateflow, 1f1b or gpipe")->capture_default_str();
  app->add_option("--stages", o->stages, "Pipeline stages P")->capture_default_str();
  app->add_option("--microbatches", o->microbatches, "Microbatches M")->capture_default_str();
  app->add_option("--chunks", o->chunks, "Chunks N per sequence (1f1b needs 1)")->capture_default_str();
  app->add_option("--seq-len", o->seq_len,
                  "With a model: the sequence length its FLOPs per token are averaged over (attention's grow with it); "
                  "with --auto: the tokens per sequence to plan for")
      ->capture_default_str();
  app->add_flag("--dump", o->dump, "Print the schedule's text form (one line per stage)");
  app->add_flag("--lowered", o->lowered, "With --dump: print it with its sends and receives");
  app->add_option("--trace", o->trace, "Write the predicted timeline as Chrome trace JSON");
  app->add_option("--preset", o->preset, "A model preset: show its stage cut and cost the stages by FLOPs");
  app->add_option("--config", o->config_path, "A model config JSON file (as --preset)");
  app->add_option("--pattern", o->pattern,
                  "Layer pattern of the model (default preset tiny when no --preset or --config): one letter per "
                  "block, '|' between stages. Letters: " +
                      mixer_letters_help());
  app->add_flag("--auto", o->automatic,
                "Search the schedule (stateflow, 1f1b, gpipe), --microbatches, --recompute and stateflow's chunk count "
                "and partition with the simulator on costs measured on --device (a short profile, cached), under "
                "the device memory limit, and print them ranked; --schedule, --microbatches, --chunks and "
                "--recompute, when given, fix that choice");
  app->add_option("--batch", o->batch, "--auto: sequences per step")->capture_default_str();
  app->add_option("--dtype", o->dtype, "--auto: f32 or f64 (the CPU's precision; GPUs run f32 master weights)")
      ->capture_default_str();
  app->add_option("--device", o->device, "--auto: where to profile and for what to plan: cpu or cuda")
      ->capture_default_str();
  app->add_option("--recompute", o->recompute, "--auto: none, full, or both (search it)")->capture_default_str();
  app->add_option("--memory-gib", o->memory_gib,
                  "--auto: memory of one device in GiB (default: 141 for cuda (H200), no limit on the cpu)");
  app->add_option("--chunk-multiple", o->multiple,
                  "--auto: chunk cuts on multiples of this many tokens (default: 2048 on cuda, which keeps the GPU step "
                  "bitwise equal to the unchunked one; the mixers' inner block on the cpu; 1: exact lengths)");
  app->add_option("--profile-dir", o->profile_dir, "--auto: where measured cost profiles are cached")
      ->capture_default_str();
  app->add_option("--write-plan", o->write_plan,
                  "--auto: write the best plan to this JSON file (train and bench take it as --chunk-lengths FILE)");
  app->add_option("--top", o->top, "--auto: rows of the ranked table")->capture_default_str();
  app->add_option("--cost-profile", o->cost_profile,
                  "--auto: plan on this recorded cost profile (a file of --profile-dir, e.g. measured on a GPU "
                  "machine and copied here) instead of profiling on --device; the profile's model, or one whose layer kinds have its shapes (a "
                  "hybrid's profile prices its GDN-only model)");
  app->add_flag("--shared-gpu", o->shared_gpu,
                "--auto: every stage on one GPU (what --transport local does with --device cuda): the stages' work "
                "runs one action at a time and their memory adds up on that GPU");
  app->add_flag("--sm-split", o->sm_split,
                "--auto: every stage on GPU 0 on its own 1/P of its SMs (what train/bench --sm-split run): the stages "
                "work side by side at the speed of a part, profiled on one part, and their memory adds up on that GPU");
  app->add_flag("--longest-seq-len", o->longest,
                "--auto: instead of ranking, find for each schedule the longest --seq-len that some configuration "
                "fits in --memory-gib (bisection on multiples of --chunk-multiple)");
  app->add_option("--max-seq-len", o->longest_limit, "--longest-seq-len: search up to this many tokens")
      ->capture_default_str();
  app->callback([o, app]() {
    if (o->automatic) return plan_automatically(*o, *app);
    Schedule s = make_schedule(o->schedule, o->stages, o->microbatches, o->chunks);
    CheckResult check = check_schedule(s);
    SF_CHECK(check.ok, "the schedule failed its check:\n", check.message);
    SF_CHECK(o->seq_len >= 1, "--seq-len ", o->seq_len, " must be >= 1 (the tokens per sequence its FLOPs are averaged over)");
    if (o->dump) std::cout << to_text(o->lowered ? lower_schedule(s) : s);
    // One whole sequence: forward 1, backward 2, activations 1 (per stage); a chunk 1/N of it.
    const double N = o->chunks;
    const int64_t chunk_bytes = 1 << 20;
    const bool with_model = !o->preset.empty() || !o->config_path.empty() || !o->pattern.empty();
    const CostTable costs =
        with_model ? model_costs(resolve_model_config(o->preset.empty() ? "tiny" : o->preset, o->config_path, o->pattern),
                                 o->stages, o->chunks, o->seq_len)
                   : uniform_costs(o->stages, o->chunks, 1.0 / N, 2.0 / N, chunk_bytes);
    SimResult r = simulate(s, costs);
    std::printf("makespan %.4f (forward of one sequence on %s = 1)\n", r.makespan,
                with_model ? "the busiest stage" : "one stage");
    std::printf("bubble fraction %.4f\n", r.bubble_fraction);
    for (int st = 0; st < o->stages; ++st)
      std::printf("stage %d: peak activations %.3f sequences (%d units in flight)\n", st,
                  double(r.peak_bytes[st][int(MemCategory::Activations)]) / (N * double(chunk_bytes)),
                  r.peak_in_flight[st]);
    if (!o->trace.empty()) write_chrome_trace(o->trace, trace_events(r.timeline, 1e3));
  });
}

}  // namespace stateflow::cli
