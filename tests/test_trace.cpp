#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "pipeline/simulate.h"
#include "pipeline/trace.h"
#include "temp_dir.h"
#include "test_util.h"

using namespace stateflow;

namespace {

nlohmann::json written(const std::vector<TraceEvent>& events) {
  std::ostringstream out;
  write_chrome_trace(out, events);
  return nlohmann::json::parse(out.str());
}

}  // namespace

TEST(Trace, SimulatedTimelineRoundTrips) {
  const Schedule s = make_schedule("stateflow", 3, 2, 2);
  const SimResult sim = simulate(s, uniform_costs(3, 2, 1.5, 2.5));
  const double us = 1000;  // one cost unit is a millisecond
  const nlohmann::json trace = written(trace_events(sim.timeline, us));

  ASSERT_TRUE(trace.contains("traceEvents"));
  const auto& list = trace["traceEvents"];
  std::vector<nlohmann::json> complete, names;
  for (const auto& e : list) (e["ph"] == "X" ? complete : names).push_back(e);
  ASSERT_EQ(complete.size(), sim.timeline.size());
  ASSERT_EQ(names.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(names[r]["ph"], "M");
    EXPECT_EQ(names[r]["name"], "thread_name");
    EXPECT_EQ(names[r]["tid"], r);
    EXPECT_EQ(names[r]["args"]["name"], cat("stage ", r));
  }
  for (size_t i = 0; i < complete.size(); ++i) {
    const TimedAction& t = sim.timeline[i];
    const auto& e = complete[i];
    EXPECT_EQ(e["name"], to_token(t.action));
    EXPECT_EQ(e["cat"], t.action.op == Op::Forward ? "forward" : "backward");
    EXPECT_EQ(e["pid"], 0);
    EXPECT_EQ(e["tid"], t.action.stage);
    EXPECT_DOUBLE_EQ(e["ts"].get<double>(), t.start * us);
    EXPECT_DOUBLE_EQ(e["dur"].get<double>(), (t.end - t.start) * us);
  }
}

TEST(Trace, EventsKeepTheirFields) {
  const std::vector<TraceEvent> events = {
      {.stage = 1, .name = "sF3.2>2", .start_us = 12.5, .dur_us = 0.25, .category = "send"},
      {.stage = 2, .name = "rF3.2<1", .start_us = 13, .dur_us = 4, .category = "recv"},
  };
  const nlohmann::json trace = written(events);
  std::vector<nlohmann::json> complete;
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "X") complete.push_back(e);
  ASSERT_EQ(complete.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(complete[i]["name"], events[i].name);
    EXPECT_EQ(complete[i]["cat"], events[i].category);
    EXPECT_EQ(complete[i]["tid"], events[i].stage);
    EXPECT_EQ(complete[i]["ts"].get<double>(), events[i].start_us);
    EXPECT_EQ(complete[i]["dur"].get<double>(), events[i].dur_us);
  }
  // Lowered actions get their own categories.
  const Action send{.op = Op::Send, .microbatch = 0, .chunk = 1, .stage = 0, .peer = 1};
  const auto from_timeline = trace_events({{.action = send, .start = 2, .end = 3}});
  ASSERT_EQ(from_timeline.size(), 1u);
  EXPECT_EQ(from_timeline[0].category, "send");
  EXPECT_EQ(from_timeline[0].name, "sF0.1>1");
}

TEST(Trace, WritesFiles) {
  const stateflow::testing::TempDir dir;
  const std::string path = dir / "trace.json";
  const SimResult sim = simulate(make_schedule("1f1b", 2, 2, 1), uniform_costs(2, 1, 1, 2));
  write_chrome_trace(path, trace_events(sim.timeline));
  std::ifstream in(path);
  const nlohmann::json trace = nlohmann::json::parse(in);
  EXPECT_EQ(trace["traceEvents"].size(), sim.timeline.size() + 2);  // plus a name per stage
  EXPECT_THROW(write_chrome_trace("/nonexistent-dir/trace.json", {}), Error);
}
