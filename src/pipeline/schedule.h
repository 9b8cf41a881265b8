// Schedules as data: for every stage, the ordered list of its actions. Generators are pure
// functions of (kind, P, M, N); check.h checks a schedule, lower.h inserts its sends and
// receives, simulate.h times it, and the engine only follows it.
//
// Text form (one line per stage, round-trips through to_text / parse_schedule_text):
//
//   schedule stateflow P=2 M=2 N=2            header: kind, stages, microbatches, chunks
//   stage 0: F0.0 F0.1 F1.0 B0.1 ...           ("lowered" is appended to lowered schedules)
//   stage 1: F0.0 B0.1 F0.1 B0.0 ...
//
// Tokens (m = microbatch, c = chunk, q = the peer stage):
//   Fm.c     forward of unit (m, c)           Bm.c     backward of unit (m, c)
//   sFm.c>q  send F(m,c)'s output (the activation) to stage q
//   rFm.c<q  receive that activation from stage q
//   sBm.c>q  send B(m,c)'s output (the input gradient) to stage q
//   rBm.c<q  receive that gradient from stage q
// so a send/receive token names the compute action whose output travels, and the arrow
// points the way it travels. Blank lines and lines starting with '#' are ignored.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace stateflow {

enum class Op : uint8_t { Forward, Backward, Send, Recv };

// What a Send/Recv carries: the output of a forward (activation, flows to higher stages) or
// of a backward (gradient w.r.t. the unit's input, flows to lower stages).
enum class Payload : uint8_t { Activation, Gradient };

struct Action {
  Op op = Op::Forward;
  int microbatch = 0;
  int chunk = 0;
  int stage = 0;
  int peer = -1;                          // Send/Recv only: the stage sent to / received from
  Payload payload = Payload::Activation;  // Send/Recv only
  bool operator==(const Action&) const = default;
};

inline bool is_compute(const Action& a) { return a.op == Op::Forward || a.op == Op::Backward; }

// The compute action whose output a Send/Recv carries (on the sending stage).
Action carried_action(const Action& message);
// The Send of compute action x's output to stage `to` (on x's stage), and the matching Recv on
// stage `to`; carried_action() undoes both.
Action send_of(const Action& x, int to);
Action recv_of(const Action& x, int to);

// The token of the text form, e.g. "F3.2" or "sF3.2>1".
std::string to_token(const Action& a);

enum class ScheduleKind { GPipe, OneFOneB, StateFlow };
const char* kind_name(ScheduleKind kind);
// Throws Error naming the accepted kinds.
ScheduleKind parse_schedule_kind(std::string_view name);

struct Schedule {
  ScheduleKind kind = ScheduleKind::StateFlow;
  int P = 1;             // stages
  int M = 1;             // microbatches
  int N = 1;             // chunks per sequence
  bool lowered = false;  // true once lower_schedule() has inserted sends and receives
  std::vector<std::vector<Action>> per_stage;
  bool operator==(const Schedule&) const = default;
};

// gpipe:     all forwards in (m, c) order, then all backwards in the reverse order.
// stateflow: chunk-level 1F1B. Units (m, c), c fastest; forwards in that order; backwards per
//            microbatch with chunks reversed. Stage r first runs min(M*N, N+P-1-r) forwards
//            (the first backward needs the last chunk of microbatch 0 through every stage),
//            then alternates one backward / one forward, then the remaining backwards.
// 1f1b:      whole sequences; exactly stateflow with N = 1 (N must be 1).
Schedule make_schedule(ScheduleKind kind, int P, int M, int N);
Schedule make_schedule(std::string_view kind, int P, int M, int N);

// The most units a stage of a generated schedule holds forwarded but not yet backwarded:
// gpipe M*N; stateflow and 1f1b min(M*N, N+P-1-stage). check_schedule() holds schedules to it.
int in_flight_bound(ScheduleKind kind, int P, int M, int N, int stage);

// Dense index of a compute action in [0, 2*P*M*N), for flat per-action tables.
inline int compute_index(const Action& a, int M, int N) {
  return ((a.stage * 2 + (a.op == Op::Backward ? 1 : 0)) * M + a.microbatch) * N + a.chunk;
}

std::string to_text(const Schedule& s);
// Throws Error naming line, column and token of the first problem.
Schedule parse_schedule_text(std::string_view text);

}  // namespace stateflow
