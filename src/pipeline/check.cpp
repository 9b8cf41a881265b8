#include "pipeline/check.h"

#include <algorithm>
#include <limits>
#include <optional>

#include "core/error.h"
#include "pipeline/dependency.h"

namespace stateflow {

const char* violation_name(Violation v) {
  switch (v) {
    case Violation::None:
      return "none";
    case Violation::BadAction:
      return "bad action";
    case Violation::Duplicate:
      return "duplicate";
    case Violation::Missing:
      return "missing";
    case Violation::Order:
      return "order";
    case Violation::Deadlock:
      return "deadlock";
    case Violation::Memory:
      return "memory";
    case Violation::MessageOrder:
      return "message order";
    case Violation::UnreceivedMessage:
      return "unreceived message";
  }
  return "?";
}

std::string render_grid(const Grid& g, int max_columns) {
  if (g.cells.empty()) return "";
  int columns = 0;
  for (const auto& row : g.cells) columns = std::max(columns, static_cast<int>(row.size()));
  int begin = 0, end = columns;
  if (columns > max_columns) {  // keep the marks in view, with a little context after them
    int last_mark = -1;
    for (auto [r, c] : g.marks) last_mark = std::max(last_mark, c);
    end = last_mark < 0 ? max_columns : std::min(columns, last_mark + 4);
    begin = std::max(0, end - max_columns);
  }
  auto is_marked = [&](int r, int c) {
    return std::find(g.marks.begin(), g.marks.end(), std::pair{r, c}) != g.marks.end();
  };
  auto cell = [&](int r, int c) -> std::string {
    const std::string token = c < static_cast<int>(g.cells[r].size()) && !g.cells[r][c].empty() ? g.cells[r][c] : ".";
    return is_marked(r, c) ? ">>" + token + "<<" : token;
  };
  std::vector<size_t> width(end, 0);  // per column, so a marked cell widens only its own
  for (int c = begin; c < end; ++c) {
    width[c] = std::to_string(c).size();
    for (int r = 0; r < static_cast<int>(g.cells.size()); ++r) width[c] = std::max(width[c], cell(r, c).size());
  }
  const size_t label_width = std::max(g.column_label.size(), cat("stage ", g.cells.size() - 1).size()) + 2;
  auto pad = [](std::string s, size_t w) { return s.append(w > s.size() ? w - s.size() : 0, ' '); };

  std::string out;
  if (begin > 0 || end < columns)
    out += cat("(", g.column_label, "s ", begin, "..", end - 1, " of 0..", columns - 1, ")\n");
  std::string line = pad(g.column_label, label_width);
  for (int c = begin; c < end; ++c) line += pad(std::to_string(c), width[c] + 2);
  out += line.substr(0, line.find_last_not_of(' ') + 1) + "\n";
  for (int r = 0; r < static_cast<int>(g.cells.size()); ++r) {
    line = pad(cat("stage ", r), label_width);
    for (int c = begin; c < end; ++c) line += pad(cell(r, c), width[c] + 2);
    out += line.substr(0, line.find_last_not_of(' ') + 1) + "\n";
  }
  return out;
}

namespace {

constexpr int kNever = std::numeric_limits<int>::max();

CheckResult failure(Violation v, const std::string& why, const Grid& g, std::vector<int> peak_in_flight = {}) {
  CheckResult result;
  result.ok = false;
  result.violation = v;
  result.message = cat(violation_name(v), ": ", why, "\n", render_grid(g));
  result.peak_in_flight = std::move(peak_in_flight);
  return result;
}

// What keeps a stage's next action from running this step.
struct Wait {
  enum Reason { None, OwnPrerequisite, OtherStage, NotReceived, SendBeforeRun, EmptyChannel, WrongMessage };
  Reason reason = None;
  Action need;  // the missing prerequisite, the action whose output is awaited, or the wrong message
};

struct Sent {
  Action carried;
  int step;
  int position;  // in the sender's list
};

// The unit-time run of a schedule that passed the structural pass.
class UnitTimeRun {
 public:
  UnitTimeRun(const Schedule& s, std::vector<int> bound)
      : s_(s),
        bound_(std::move(bound)),
        done_step_(2 * s.P * s.M * s.N, kNever),
        received_step_(s.P, std::vector<int>(2 * s.P * s.M * s.N, kNever)),
        channel_(2 * s.P * s.P),
        channel_head_(2 * s.P * s.P, 0),
        position_(s.P, 0),
        in_flight_(s.P, 0),
        peak_in_flight_(s.P, 0),
        step_of_(s.P) {
    for (int r = 0; r < s.P; ++r) step_of_[r].assign(s.per_stage[r].size(), -1);
  }

  // Runs to the end or to the first violation.
  CheckResult run() {
    for (step_ = 0;; ++step_) {
      bool all_done = true, moved = false;
      // The first problem of a step is reported once the step is complete, so the grid shows it whole.
      std::optional<std::pair<Violation, std::string>> problem;
      int problem_stage = 0;
      for (int r = 0; r < s_.P; ++r) {
        if (position_[r] == static_cast<int>(s_.per_stage[r].size())) continue;
        all_done = false;
        const Action& a = s_.per_stage[r][position_[r]];
        const Wait w = wait_of(r, a);
        if (w.reason == Wait::WrongMessage && !problem) {
          problem = explain(r, a, w);
          problem_stage = r;
        }
        if (w.reason != Wait::None) continue;
        execute(r, a);
        moved = true;
        if (a.op == Op::Forward && in_flight_[r] > bound_[r] && !problem) {
          problem = {Violation::Memory,
                     cat("stage ", r, " holds ", in_flight_[r], " units forwarded but not yet backwarded after ",
                         to_token(a), " at step ", step_, "; the bound is ", bound_[r])};
          problem_stage = r;
        }
      }
      if (problem) return fail(problem->first, problem->second, {{problem_stage, step_}});
      if (all_done) break;
      if (!moved) return stuck();
    }
    for (size_t ch = 0; ch < channel_.size(); ++ch)
      if (channel_head_[ch] < channel_[ch].size()) {
        const Sent& m = channel_[ch][channel_head_[ch]];
        const int from = m.carried.stage, to = static_cast<int>(ch / 2) % s_.P;
        return fail(Violation::UnreceivedMessage,
                    cat("stage ", from, " sends the output of ", to_token(m.carried), " to stage ", to,
                        ", which never receives it"),
                    {{from, step_of_[from][m.position]}});
      }
    CheckResult result;
    result.steps = step_;
    result.peak_in_flight = peak_in_flight_;
    return result;
  }

  Grid grid() const {
    Grid g;
    g.cells.resize(s_.P);
    for (int r = 0; r < s_.P; ++r)
      for (int i = 0; i < position_[r]; ++i) {
        const int t = step_of_[r][i];
        if (t >= static_cast<int>(g.cells[r].size())) g.cells[r].resize(t + 1);
        g.cells[r][t] = to_token(s_.per_stage[r][i]);
      }
    return g;
  }

 private:
  int index(const Action& a) const { return compute_index(a, s_.M, s_.N); }
  int channel_of(int from, int to, Payload p) const { return (from * s_.P + to) * 2 + static_cast<int>(p); }

  Wait wait_of(int r, const Action& a) const {
    if (is_compute(a)) {
      const Prerequisites needs = prerequisites(a, s_.P, s_.N);
      // Needs on this stage first, so that a stuck action blames its own list before others.
      for (const Action& need : needs)
        if (need.stage == r && done_step_[index(need)] >= step_) return {Wait::OwnPrerequisite, need};
      // Unlowered, another stage's output counts once that stage has run it; lowered, once received.
      for (const Action& need : needs) {
        if (need.stage == r) continue;
        if (!s_.lowered && done_step_[index(need)] >= step_) return {Wait::OtherStage, need};
        if (s_.lowered && received_step_[r][index(need)] >= step_) return {Wait::NotReceived, need};
      }
      return {};
    }
    const Action carried = carried_action(a);
    if (a.op == Op::Send) return done_step_[index(carried)] >= step_ ? Wait{Wait::SendBeforeRun, carried} : Wait{};
    const int ch = channel_of(a.peer, r, a.payload);
    if (channel_head_[ch] == channel_[ch].size() || channel_[ch][channel_head_[ch]].step >= step_)
      return {Wait::EmptyChannel, carried};
    const Action& next = channel_[ch][channel_head_[ch]].carried;
    return next == carried ? Wait{} : Wait{Wait::WrongMessage, next};
  }

  // What a wait means once no stage can move (or at once, for a wrong message), and why.
  std::pair<Violation, std::string> explain(int r, const Action& a, const Wait& w) const {
    const std::string at = cat("stage ", r, " cannot run ", to_token(a), ": ");
    switch (w.reason) {
      case Wait::OwnPrerequisite:
        return {Violation::Order, cat(at, "it needs ", to_token(w.need), ", which stage ", r, " runs later")};
      case Wait::OtherStage:
        return {Violation::Deadlock,
                cat("stage ", r, " waits at ", to_token(a), " for ", to_token(w.need), " on stage ", w.need.stage)};
      case Wait::NotReceived: {
        const Action recv = recv_of(w.need, r);
        const auto& list = s_.per_stage[r];
        const bool later = std::find(list.begin() + position_[r], list.end(), recv) != list.end();
        return {later ? Violation::Order : Violation::Missing,
                cat(at, "it needs the output of ", to_token(w.need), " from stage ", w.need.stage, ", which stage ", r,
                    later ? " receives only later (" : " never receives (", to_token(recv), ")")};
      }
      case Wait::SendBeforeRun:
        return {Violation::Order,
                cat(at, "it sends the output of ", to_token(w.need), ", which stage ", r, " runs later")};
      case Wait::EmptyChannel: {
        const bool sender_done = position_[a.peer] == static_cast<int>(s_.per_stage[a.peer].size());
        return {sender_done ? Violation::Missing : Violation::Deadlock,
                cat("stage ", r, " waits at ", to_token(a), " for the output of ", to_token(w.need), " from stage ",
                    a.peer, sender_done ? ", which never sends it" : "")};
      }
      case Wait::WrongMessage:
        return {Violation::MessageOrder, cat(at, "the next message from stage ", a.peer,
                                             " on its channel carries the output of ", to_token(w.need))};
      case Wait::None:
        break;
    }
    return {Violation::None, ""};
  }

  void execute(int r, const Action& a) {
    step_of_[r][position_[r]] = step_;
    if (is_compute(a)) {
      done_step_[index(a)] = step_;
      in_flight_[r] += a.op == Op::Forward ? 1 : -1;
      peak_in_flight_[r] = std::max(peak_in_flight_[r], in_flight_[r]);
    } else if (a.op == Op::Send) {
      channel_[channel_of(r, a.peer, a.payload)].push_back({carried_action(a), step_, position_[r]});
    } else {
      const int ch = channel_of(a.peer, r, a.payload);
      received_step_[r][index(channel_[ch][channel_head_[ch]++].carried)] = step_;
    }
    ++position_[r];
  }

  // No stage can move: name the first stage whose own list is at fault, else the wait cycle.
  CheckResult stuck() {
    std::vector<std::pair<int, int>> blocked;
    std::string waits;
    for (int r = 0; r < s_.P; ++r) {
      if (position_[r] == static_cast<int>(s_.per_stage[r].size())) continue;
      const Action& a = s_.per_stage[r][position_[r]];
      const auto [violation, why] = explain(r, a, wait_of(r, a));
      if (violation != Violation::Deadlock) return fail(violation, why, {{r, step_}});
      waits += (waits.empty() ? "" : "; ") + why;
      blocked.push_back({r, step_});
    }
    return fail(Violation::Deadlock, cat("no stage can move at step ", step_, ": ", waits), blocked);
  }

  // The grid shows what ran, plus the marked cells (actions that could not run sit at step_).
  CheckResult fail(Violation v, const std::string& why, const std::vector<std::pair<int, int>>& marks) {
    Grid g = grid();
    for (auto [r, t] : marks) {
      if (t >= static_cast<int>(g.cells[r].size())) g.cells[r].resize(t + 1);
      if (g.cells[r][t].empty()) g.cells[r][t] = to_token(s_.per_stage[r][position_[r]]);
    }
    g.marks = marks;
    return failure(v, why, g, peak_in_flight_);
  }

  const Schedule& s_;
  std::vector<int> bound_;
  std::vector<int> done_step_;                   // by compute_index
  std::vector<std::vector<int>> received_step_;  // [stage][compute_index of the carried action]
  std::vector<std::vector<Sent>> channel_;       // [channel_of(from, to, payload)]
  std::vector<size_t> channel_head_;
  std::vector<int> position_, in_flight_, peak_in_flight_;
  std::vector<std::vector<int>> step_of_;  // [stage][position]
  int step_ = 0;
};

CheckResult structural_failure(const Schedule& s, Violation v, const std::string& why,
                               const std::vector<std::pair<int, int>>& marks) {
  Grid g;
  g.column_label = "pos";
  for (const auto& list : s.per_stage) {
    auto& row = g.cells.emplace_back();
    for (const Action& a : list) row.push_back(to_token(a));
  }
  g.marks = marks;
  return failure(v, why, g);
}

// Why an action does not belong at this place of the schedule ("" if it does).
std::string misplaced(const Schedule& s, int r, const Action& a, const std::vector<std::vector<int>>& consumers) {
  if (a.stage != r) return cat(to_token(a), " in stage ", r, "'s list says stage ", a.stage);
  if (a.microbatch < 0 || a.microbatch >= s.M) return cat(to_token(a), ": microbatch out of range (M=", s.M, ")");
  if (a.chunk < 0 || a.chunk >= s.N) return cat(to_token(a), ": chunk out of range (N=", s.N, ")");
  if (is_compute(a)) return "";
  if (!s.lowered) return cat(to_token(a), " on stage ", r, ": sends and receives belong to lowered schedules only");
  if (a.peer < 0 || a.peer >= s.P || a.peer == r)
    return cat(to_token(a), ": peer must be another stage in 0..", s.P - 1);
  const Action carried = carried_action(a);
  const int consumer = a.op == Op::Send ? a.peer : r;
  const auto& stages = consumers[compute_index(carried, s.M, s.N)];
  if (std::find(stages.begin(), stages.end(), consumer) == stages.end())
    return cat(to_token(a), " on stage ", r, ": stage ", consumer, " does not need the output of ", to_token(carried),
               " from stage ", carried.stage);
  return "";
}

CheckResult run_check(const Schedule& s, const CheckOptions& options, Grid* grid) {
  SF_CHECK(s.P >= 1 && s.M >= 1 && s.N >= 1, "check_schedule: bad shape P=", s.P, " M=", s.M, " N=", s.N,
           "; each must be >= 1");
  SF_CHECK(static_cast<int>(s.per_stage.size()) == s.P, "check_schedule: the schedule has ", s.per_stage.size(),
           " stage lists for P=", s.P);
  std::vector<int> bound = options.max_in_flight;
  if (bound.empty())
    for (int r = 0; r < s.P; ++r) bound.push_back(in_flight_bound(s.kind, s.P, s.M, s.N, r));
  SF_CHECK(static_cast<int>(bound.size()) == s.P, "check_schedule: max_in_flight has ", bound.size(),
           " entries; give one per stage (P=", s.P, ") or none");
  if (!options.check_memory) bound.assign(s.P, std::numeric_limits<int>::max());

  const std::vector<std::vector<int>> consumers = consumer_stages(s.P, s.M, s.N);
  std::vector<int> first_position(2 * s.P * s.M * s.N, -1);
  for (int r = 0; r < s.P; ++r)
    for (int i = 0; i < static_cast<int>(s.per_stage[r].size()); ++i) {
      const Action& a = s.per_stage[r][i];
      if (std::string why = misplaced(s, r, a, consumers); !why.empty())
        return structural_failure(s, Violation::BadAction, why, {{r, i}});
      if (!is_compute(a)) continue;
      int& first = first_position[compute_index(a, s.M, s.N)];
      if (first >= 0)
        return structural_failure(s, Violation::Duplicate,
                                  cat("stage ", r, " runs ", to_token(a), " twice (positions ", first, " and ", i, ")"),
                                  {{r, first}, {r, i}});
      first = i;
    }
  for (int r = 0; r < s.P; ++r)
    for (Op op : {Op::Forward, Op::Backward})
      for (int m = 0; m < s.M; ++m)
        for (int c = 0; c < s.N; ++c) {
          const Action a{.op = op, .microbatch = m, .chunk = c, .stage = r};
          if (first_position[compute_index(a, s.M, s.N)] < 0)
            return structural_failure(
                s, Violation::Missing,
                cat("stage ", r, " never runs ", to_token(a), " (every stage runs F and B of every unit exactly once)"),
                {});
        }

  UnitTimeRun run(s, std::move(bound));
  CheckResult result = run.run();
  if (grid) *grid = run.grid();
  return result;
}

}  // namespace

CheckResult check_schedule(const Schedule& s, const CheckOptions& options) { return run_check(s, options, nullptr); }

std::string render_execution_grid(const Schedule& s) {
  Grid grid;
  const CheckResult result = run_check(s, {.check_memory = false, .max_in_flight = {}}, &grid);
  SF_CHECK(result.ok, "render_execution_grid: the schedule does not run: ", result.message);
  return render_grid(grid, std::numeric_limits<int>::max());
}

}  // namespace stateflow
