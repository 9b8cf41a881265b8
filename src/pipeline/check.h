// The schedule checker. It runs a schedule in unit time (every action takes one step; each
// stage runs its list in order and waits until what the next action needs is done) and
// reports the first violation, with a stage x step grid marking the offending cells:
//
//   completeness  every F and B of every unit exactly once on every stage
//   order         a stage waits for something its own list does later (e.g. F0.1 before F0.0)
//   deadlock      stages wait for each other in a cycle
//   memory        a stage holds more units forwarded-but-not-backwarded than the bound
//   messages      (lowered schedules) each channel (sender, receiver, payload) delivers in
//                 send order: a receive must name the next message sent on its channel,
//                 compute actions use only received outputs of other stages, receives block,
//                 sends are buffered, and every send is received
#pragma once
#include <string>
#include <vector>

#include "pipeline/schedule.h"

namespace stateflow {

enum class Violation {
  None,
  BadAction,          // out of range, on the wrong stage, a message nobody needs, or a send/recv unlowered
  Duplicate,          // a compute action twice on one stage
  Missing,            // a compute action, send or receive that never happens
  Order,              // a stage needs something its own list provides only later
  Deadlock,           // stages wait for each other
  Memory,             // in-flight units above the bound
  MessageOrder,       // a receive names another message than the next one on its channel
  UnreceivedMessage,  // a send nobody receives
};
const char* violation_name(Violation v);

struct CheckOptions {
  bool check_memory = true;
  // Most units a stage may hold forwarded but not yet backwarded, one entry per stage;
  // empty: in_flight_bound() of the schedule's kind.
  std::vector<int> max_in_flight;
};

struct CheckResult {
  bool ok = true;
  Violation violation = Violation::None;
  std::string message;              // the first violation and its grid; empty when ok
  int steps = 0;                    // unit-time makespan (when ok)
  std::vector<int> peak_in_flight;  // per stage, as far as the run got
};

CheckResult check_schedule(const Schedule& s, const CheckOptions& options = {});

// The unit-time run of a schedule as a stage x step grid (for docs, logs and the CLI).
// Throws Error with the checker's message if the schedule does not run to the end.
std::string render_execution_grid(const Schedule& s);

// A grid of tokens: rows are stages, columns are steps (or list positions), "" is idle.
// Marked cells print as >>token<<; wide grids show a window of columns around the marks.
struct Grid {
  std::string column_label = "step";
  std::vector<std::vector<std::string>> cells;  // [stage][column]
  std::vector<std::pair<int, int>> marks;       // (stage, column)
};
std::string render_grid(const Grid& g, int max_columns = 24);

}  // namespace stateflow
