// Timelines and Chrome trace-event JSON (chrome://tracing, https://ui.perfetto.dev). The
// simulator and the engine both produce a timeline of timed actions; trace_events() turns it
// into trace events, one row (tid) per stage, and write_chrome_trace() writes them.
#pragma once
#include <iosfwd>
#include <string>
#include <vector>

#include "pipeline/schedule.h"

namespace stateflow {

// One action as it ran: start and end in the timeline's unit (simulated cost units, seconds...).
struct TimedAction {
  Action action;
  double start = 0;
  double end = 0;
};

struct TraceEvent {
  int stage = 0;     // becomes the trace's tid: one row per stage
  std::string name;  // e.g. "F3.2"
  double start_us = 0;
  double dur_us = 0;
  std::string category;  // "forward", "backward", "send", "recv" for actions
};

// Events named by action tokens; us_per_time_unit converts the timeline's unit to microseconds.
std::vector<TraceEvent> trace_events(const std::vector<TimedAction>& timeline, double us_per_time_unit = 1.0);

// Writes {"traceEvents": [...]}: one complete ("ph":"X") event per TraceEvent with pid 0 and
// tid = stage, plus a thread_name metadata ("ph":"M") event per stage so rows read "stage r".
void write_chrome_trace(std::ostream& out, const std::vector<TraceEvent>& events);
void write_chrome_trace(const std::string& path, const std::vector<TraceEvent>& events);

}  // namespace stateflow
