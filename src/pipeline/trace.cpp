#include "pipeline/trace.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"

namespace stateflow {

namespace {

const char* op_category(Op op) {
  switch (op) {
    case Op::Forward:
      return "forward";
    case Op::Backward:
      return "backward";
    case Op::Send:
      return "send";
    case Op::Recv:
      return "recv";
  }
  return "?";
}

}  // namespace

std::vector<TraceEvent> trace_events(const std::vector<TimedAction>& timeline, double us_per_time_unit) {
  std::vector<TraceEvent> events;
  events.reserve(timeline.size());
  for (const TimedAction& t : timeline)
    events.push_back({.stage = t.action.stage,
                      .name = to_token(t.action),
                      .start_us = t.start * us_per_time_unit,
                      .dur_us = (t.end - t.start) * us_per_time_unit,
                      .category = op_category(t.action.op)});
  return events;
}

void write_chrome_trace(std::ostream& out, const std::vector<TraceEvent>& events) {
  nlohmann::json list = nlohmann::json::array();
  std::set<int> stages;
  for (const TraceEvent& e : events) stages.insert(e.stage);
  for (int r : stages)
    list.push_back(
        {{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", r}, {"args", {{"name", cat("stage ", r)}}}});
  for (const TraceEvent& e : events)
    list.push_back({{"name", e.name},
                    {"cat", e.category},
                    {"ph", "X"},
                    {"ts", e.start_us},
                    {"dur", e.dur_us},
                    {"pid", 0},
                    {"tid", e.stage}});
  out << nlohmann::json{{"traceEvents", list}, {"displayTimeUnit", "ms"}}.dump() << "\n";
}

void write_chrome_trace(const std::string& path, const std::vector<TraceEvent>& events) {
  std::ofstream out(path);
  SF_CHECK(out, "cannot open trace file '", path, "' for writing; check that its directory exists");
  write_chrome_trace(out, events);
  out.close();
  SF_CHECK(out, "failed writing trace file '", path, "'");
}

}  // namespace stateflow
