// `stateflow plan`
#include <cstdio>
#include <iostream>

#include "cli/commands.h"
#include "core/error.h"
#include "pipeline/check.h"
#include "pipeline/lower.h"
#include "pipeline/simulate.h"

namespace stateflow::cli {

void add_plan_command(CLI::App& root) {
  auto* app = root.add_subcommand(
      "plan", "Show a schedule and what the simulator predicts for it (equal per-chunk costs, backward = 2x forward)");
  struct Opts {
    std::string schedule = "stateflow";
    int stages = 4, microbatches = 4, chunks = 4;
    bool dump = false, lowered = false;
    std::string trace;
  };
  auto o = std::make_shared<Opts>();
  app->add_option("--schedule", o->schedule, "stateflow, 1f1b or gpipe")->capture_default_str();
  app->add_option("--stages", o->stages, "Pipeline stages P")->capture_default_str();
  app->add_option("--microbatches", o->microbatches, "Microbatches M")->capture_default_str();
  app->add_option("--chunks", o->chunks, "Chunks N per sequence (1f1b needs 1)")->capture_default_str();
  app->add_flag("--dump", o->dump, "Print the schedule's text form (one line per stage)");
  app->add_flag("--lowered", o->lowered, "With --dump: print it with its sends and receives");
  app->add_option("--trace", o->trace, "Write the predicted timeline as Chrome trace JSON");
  app->callback([o]() {
    Schedule s = make_schedule(o->schedule, o->stages, o->microbatches, o->chunks);
    CheckResult check = check_schedule(s);
    SF_CHECK(check.ok, "the schedule failed its check:\n", check.message);
    if (o->dump) std::cout << to_text(o->lowered ? lower_schedule(s) : s);
    // One whole sequence: forward 1, backward 2, activations 1 (per stage); a chunk 1/N of it.
    const double N = o->chunks;
    const int64_t chunk_bytes = 1 << 20;
    SimResult r = simulate(s, uniform_costs(o->stages, o->chunks, 1.0 / N, 2.0 / N, chunk_bytes));
    std::printf("makespan %.4f (forward of one sequence on one stage = 1)\n", r.makespan);
    std::printf("bubble fraction %.4f\n", r.bubble_fraction);
    for (int st = 0; st < o->stages; ++st)
      std::printf("stage %d: peak activations %.3f sequences (%d units in flight)\n", st,
                  double(r.peak_bytes[st][int(MemCategory::Activations)]) / (N * double(chunk_bytes)),
                  r.peak_in_flight[st]);
    if (!o->trace.empty()) write_chrome_trace(o->trace, trace_events(r.timeline, 1e3));
  });
}

}  // namespace stateflow::cli
