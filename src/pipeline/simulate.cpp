#include "pipeline/simulate.h"

#include <algorithm>

#include "core/error.h"
#include "pipeline/check.h"
#include "pipeline/dependency.h"

namespace stateflow {

CostTable uniform_costs(int P, int N, double forward, double backward, int64_t activation_bytes) {
  ByteCounts unit{};
  unit[static_cast<int>(MemCategory::Activations)] = activation_bytes;
  return CostTable{.forward_time = std::vector(P, std::vector<double>(N, forward)),
                   .backward_time = std::vector(P, std::vector<double>(N, backward)),
                   .unit_bytes = std::vector(P, std::vector<ByteCounts>(N, unit)),
                   .resident_bytes = {},
                   .send_time = {},
                   .kv_prefix_bytes = {},
                   .kv_grad_bytes = {},
                   .forward_work_bytes = {},
                   .backward_work_bytes = {},
                   .shared_device = false};
}

namespace {

void check_table(const Schedule& s, const CostTable& t) {
  auto fits = [&](const auto& per_stage) {
    return static_cast<int>(per_stage.size()) == s.P &&
           std::all_of(per_stage.begin(), per_stage.end(),
                       [&](const auto& row) { return static_cast<int>(row.size()) == s.N; });
  };
  SF_CHECK(fits(t.forward_time) && fits(t.backward_time), "simulate: forward_time and backward_time need [P=", s.P,
           "][N=", s.N, "] entries");
  SF_CHECK(t.unit_bytes.empty() || fits(t.unit_bytes), "simulate: unit_bytes needs [P=", s.P, "][N=", s.N,
           "] entries or none");
  SF_CHECK(t.resident_bytes.empty() || static_cast<int>(t.resident_bytes.size()) == s.P,
           "simulate: resident_bytes needs P=", s.P, " entries or none");
  SF_CHECK(t.send_time.empty() || static_cast<int>(t.send_time.size()) == s.N, "simulate: send_time needs N=", s.N,
           " entries or none");
  SF_CHECK((t.forward_work_bytes.empty() || fits(t.forward_work_bytes)) &&
               (t.backward_work_bytes.empty() || fits(t.backward_work_bytes)),
           "simulate: forward_work_bytes and backward_work_bytes need [P=", s.P, "][N=", s.N, "] entries or none");
  for (const auto* kv : {&t.kv_prefix_bytes, &t.kv_grad_bytes})
    SF_CHECK(kv->empty() || static_cast<int>(kv->size()) == s.P, "simulate: kv_prefix_bytes and kv_grad_bytes need P=",
             s.P, " entries or none");
  // A negative (or NaN) time would keep an action from ever being ready: refuse it, don't spin.
  auto valid = [](double x) { return x >= 0; };
  auto all_valid = [&](const std::vector<std::vector<double>>& per_stage) {
    return std::all_of(per_stage.begin(), per_stage.end(),
                       [&](const auto& row) { return std::all_of(row.begin(), row.end(), valid); });
  };
  SF_CHECK(all_valid(t.forward_time) && all_valid(t.backward_time) &&
               std::all_of(t.send_time.begin(), t.send_time.end(), valid),
           "simulate: every forward, backward and send time must be a number >= 0 (a measured cost came out "
           "negative or NaN)");
}

// Peak bytes of one stage: they change only with its own actions, so its list order decides them.
void peak_memory(const Schedule& s, const CostTable& t, int r, SimResult& out) {
  ByteCounts current = t.resident_bytes.empty() ? ByteCounts{} : t.resident_bytes[r];
  ByteCounts peak = current;
  auto total = [](const ByteCounts& b) {
    int64_t sum = 0;
    for (int64_t x : b) sum += x;
    return sum;
  };
  int64_t peak_total = total(current);
  int in_flight = 0, peak_in_flight = 0;
  const int kv = static_cast<int>(MemCategory::KvPrefix);
  const int64_t prefix = t.kv_prefix_bytes.empty() ? 0 : t.kv_prefix_bytes[r],
                grad = t.kv_grad_bytes.empty() ? 0 : t.kv_grad_bytes[r];
  const int other = static_cast<int>(MemCategory::Other);
  for (const Action& a : s.per_stage[r]) {
    const bool forward = a.op == Op::Forward;
    in_flight += forward ? 1 : -1;
    peak_in_flight = std::max(peak_in_flight, in_flight);
    // A microbatch's K/V prefix comes with its first forward, its gradient with its first
    // backward (the last chunk's), and both live through its chunk 0 backward.
    if (forward && a.chunk == 0) current[kv] += prefix;
    if (!forward && a.chunk == s.N - 1) current[kv] += grad;
    if (forward && !t.unit_bytes.empty())
      for (int k = 0; k < kNumMemCategories; ++k) current[k] += t.unit_bytes[r][a.chunk][k];
    // While the action runs its unit's stash is held (a backward frees it as it ends) and its
    // working memory comes on top.
    const auto& work = forward ? t.forward_work_bytes : t.backward_work_bytes;
    if (!work.empty()) {
      const int64_t w = work[r][a.chunk];
      peak[other] = std::max(peak[other], current[other] + w);
      peak_total = std::max(peak_total, total(current) + w);
    }
    if (!forward && !t.unit_bytes.empty())
      for (int k = 0; k < kNumMemCategories; ++k) current[k] -= t.unit_bytes[r][a.chunk][k];
    for (int k = 0; k < kNumMemCategories; ++k) peak[k] = std::max(peak[k], current[k]);
    peak_total = std::max(peak_total, total(current));
    if (!forward && a.chunk == 0) current[kv] -= prefix + grad;
  }
  out.peak_bytes[r] = peak;
  out.peak_total_bytes[r] = peak_total;
  out.peak_in_flight[r] = peak_in_flight;
}

}  // namespace

SimResult simulate(const Schedule& s, const CostTable& costs) {
  SF_CHECK(!s.lowered, "simulate takes the schedule before lowering; messages are modelled by CostTable::send_time");
  check_table(s, costs);
  const CheckResult runs = check_schedule(s, {.check_memory = false, .max_in_flight = {}});
  SF_CHECK(runs.ok, "simulate: the schedule cannot run: ", runs.message);

  SimResult out;
  out.busy.assign(s.P, 0);
  out.peak_bytes.assign(s.P, ByteCounts{});
  out.peak_total_bytes.assign(s.P, 0);
  out.peak_in_flight.assign(s.P, 0);
  std::vector<double> finish(2 * s.P * s.M * s.N, -1);  // by compute_index; -1 until timed
  std::vector<double> stage_free(s.P, 0);
  std::vector<size_t> position(s.P, 0);
  size_t total = 0, timed = 0;
  for (const auto& list : s.per_stage) total += list.size();
  // When r's next action can start: its stage free, its prerequisites done (plus a message from
  // another stage) and, on a shared device, the device free; -1 while a prerequisite is untimed.
  double device_free = 0;
  auto start_of = [&](int r) {
    const Action& a = s.per_stage[r][position[r]];
    double start = costs.shared_device ? std::max(stage_free[r], device_free) : stage_free[r];
    for (const Action& need : prerequisites(a, s.P, s.N)) {
      const double done = finish[compute_index(need, s.M, s.N)];
      if (done < 0) return -1.0;
      const double message = need.stage != r && !costs.send_time.empty() ? costs.send_time[need.chunk] : 0;
      start = std::max(start, done + message);
    }
    return start;
  };
  auto run = [&](int r, double start) {
    const Action& a = s.per_stage[r][position[r]++];
    const double cost = (a.op == Op::Forward ? costs.forward_time : costs.backward_time)[r][a.chunk];
    finish[compute_index(a, s.M, s.N)] = stage_free[r] = device_free = start + cost;
    out.busy[r] += cost;
    out.timeline.push_back({a, start, start + cost});
    ++timed;
  };
  // The checker showed the schedule runs, so every sweep times at least one more action.
  while (timed < total) {
    if (costs.shared_device) {  // the ready action that can start first (the lower stage on a tie)
      int first = -1;
      double first_start = 0;
      for (int r = 0; r < s.P; ++r)
        if (position[r] < s.per_stage[r].size())
          if (const double start = start_of(r); start >= 0 && (first < 0 || start < first_start))
            first = r, first_start = start;
      run(first, first_start);
      continue;
    }
    for (int r = 0; r < s.P; ++r)
      for (double start; position[r] < s.per_stage[r].size() && (start = start_of(r)) >= 0;) run(r, start);
  }
  for (int r = 0; r < s.P; ++r) {
    out.makespan = std::max(out.makespan, stage_free[r]);
    peak_memory(s, costs, r, out);
  }
  double busy = 0;
  for (double b : out.busy) busy += b;
  out.bubble_fraction = out.makespan > 0 ? 1 - busy / (s.P * out.makespan) : 0;
  std::stable_sort(out.timeline.begin(), out.timeline.end(), [](const TimedAction& x, const TimedAction& y) {
    return x.start != y.start ? x.start < y.start : x.action.stage < y.action.stage;
  });
  return out;
}

}  // namespace stateflow
