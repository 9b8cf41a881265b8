#include "pipeline/lower.h"

#include "core/error.h"
#include "pipeline/dependency.h"

namespace stateflow {

Schedule lower_schedule(const Schedule& s) {
  SF_CHECK(!s.lowered, "lower_schedule: the schedule is already lowered");
  SF_CHECK(static_cast<int>(s.per_stage.size()) == s.P, "lower_schedule: schedule has ", s.per_stage.size(),
           " stage lists for P=", s.P);
  for (int r = 0; r < s.P; ++r)
    for (const Action& a : s.per_stage[r])
      SF_CHECK(
          is_compute(a) && a.stage == r && a.microbatch >= 0 && a.microbatch < s.M && a.chunk >= 0 && a.chunk < s.N,
          "lower_schedule: stage ", r, " has action ", to_token(a), " (stage ", a.stage,
          ") that does not fit the schedule; run check_schedule first");

  // Channel (sender p, receiver q): the actions whose outputs p sends q, in p's order.
  // Payload is implied by the carried action, so one list per (p, q) keeps both directions.
  const std::vector<std::vector<int>> consumers = consumer_stages(s.P, s.M, s.N);
  std::vector<std::vector<Action>> channel(s.P * s.P);
  for (int p = 0; p < s.P; ++p)
    for (const Action& a : s.per_stage[p])
      for (int q : consumers[compute_index(a, s.M, s.N)]) channel[p * s.P + q].push_back(a);

  Schedule out = s;
  out.lowered = true;
  std::vector<size_t> next_in_channel(s.P * s.P, 0);
  for (int q = 0; q < s.P; ++q) {
    std::vector<char> received(2 * s.P * s.M * s.N, 0);  // by compute_index of the carried action
    std::vector<Action>& list = out.per_stage[q];
    list.clear();
    for (const Action& a : s.per_stage[q]) {
      for (const Action& need : prerequisites(a, s.P, s.N)) {
        if (need.stage == q || received[compute_index(need, s.M, s.N)]) continue;
        const int ch = need.stage * s.P + q;
        const std::vector<Action>& sent = channel[ch];
        bool found = false;
        while (!found) {
          SF_CHECK(next_in_channel[ch] < sent.size(), "lower_schedule: stage ", q, " runs ", to_token(a),
                   ", which needs ", to_token(need), " from stage ", need.stage, ", but stage ", need.stage,
                   " never runs it; run check_schedule first");
          const Action& m = sent[next_in_channel[ch]++];
          received[compute_index(m, s.M, s.N)] = 1;
          list.push_back(recv_of(m, q));
          found = m == need;
        }
      }
      list.push_back(a);
      for (int peer : consumers[compute_index(a, s.M, s.N)]) list.push_back(send_of(a, peer));
    }
  }
  return out;
}

}  // namespace stateflow
