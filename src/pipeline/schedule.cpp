#include "pipeline/schedule.h"

#include <algorithm>
#include <charconv>

#include "core/error.h"

namespace stateflow {

Action carried_action(const Action& message) {
  SF_CHECK(message.op == Op::Send || message.op == Op::Recv, "carried_action needs a Send or Recv, got ",
           to_token(message));
  return Action{.op = message.payload == Payload::Activation ? Op::Forward : Op::Backward,
                .microbatch = message.microbatch,
                .chunk = message.chunk,
                .stage = message.op == Op::Send ? message.stage : message.peer};
}

Action send_of(const Action& x, int to) {
  SF_CHECK(is_compute(x), "send_of needs a forward or backward action, got ", to_token(x));
  return Action{.op = Op::Send,
                .microbatch = x.microbatch,
                .chunk = x.chunk,
                .stage = x.stage,
                .peer = to,
                .payload = x.op == Op::Forward ? Payload::Activation : Payload::Gradient};
}

Action recv_of(const Action& x, int to) {
  Action recv = send_of(x, to);
  recv.op = Op::Recv;
  recv.stage = to;
  recv.peer = x.stage;
  return recv;
}

std::string to_token(const Action& a) {
  const std::string unit = cat(a.microbatch, ".", a.chunk);
  const char* letter = a.payload == Payload::Activation ? "F" : "B";
  switch (a.op) {
    case Op::Forward:
      return "F" + unit;
    case Op::Backward:
      return "B" + unit;
    case Op::Send:
      return cat("s", letter, unit, ">", a.peer);
    case Op::Recv:
      return cat("r", letter, unit, "<", a.peer);
  }
  return "?";
}

const char* kind_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::GPipe:
      return "gpipe";
    case ScheduleKind::OneFOneB:
      return "1f1b";
    case ScheduleKind::StateFlow:
      return "stateflow";
  }
  return "?";
}

ScheduleKind parse_schedule_kind(std::string_view name) {
  for (ScheduleKind k : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::StateFlow})
    if (name == kind_name(k)) return k;
  fail("unknown schedule kind '", name, "': expected one of gpipe, 1f1b, stateflow");
}

namespace {

void check_shape(int P, int M, int N) {
  SF_CHECK(P >= 1, "a schedule needs P >= 1 pipeline stages, got P=", P);
  SF_CHECK(M >= 1, "a schedule needs M >= 1 microbatches, got M=", M);
  SF_CHECK(N >= 1, "a schedule needs N >= 1 chunks per sequence, got N=", N);
}

std::vector<Action> gpipe_stage(int r, int M, int N) {
  std::vector<Action> out;
  for (int m = 0; m < M; ++m)
    for (int c = 0; c < N; ++c) out.push_back({.op = Op::Forward, .microbatch = m, .chunk = c, .stage = r});
  for (int m = M - 1; m >= 0; --m)
    for (int c = N - 1; c >= 0; --c) out.push_back({.op = Op::Backward, .microbatch = m, .chunk = c, .stage = r});
  return out;
}

std::vector<Action> stateflow_stage(int r, int P, int M, int N) {
  const int units = M * N;
  // The k-th forward and the k-th backward of the stage: forwards in (m, c) order, backwards
  // microbatch by microbatch with the chunks reversed (boundary-state gradients flow c+1 -> c).
  auto forward = [&](int k) { return Action{.op = Op::Forward, .microbatch = k / N, .chunk = k % N, .stage = r}; };
  auto backward = [&](int k) {
    return Action{.op = Op::Backward, .microbatch = k / N, .chunk = N - 1 - k % N, .stage = r};
  };
  const int warmup = in_flight_bound(ScheduleKind::StateFlow, P, M, N, r);
  std::vector<Action> out;
  for (int k = 0; k < warmup; ++k) out.push_back(forward(k));
  for (int k = 0; k < units; ++k) {
    out.push_back(backward(k));
    if (warmup + k < units) out.push_back(forward(warmup + k));
  }
  return out;
}

}  // namespace

int in_flight_bound(ScheduleKind kind, int P, int M, int N, int stage) {
  if (kind == ScheduleKind::GPipe) return M * N;
  return std::min(M * N, N + P - 1 - stage);
}

Schedule make_schedule(ScheduleKind kind, int P, int M, int N) {
  check_shape(P, M, N);
  if (kind == ScheduleKind::OneFOneB) {
    SF_CHECK(N == 1, "schedule kind 1f1b runs whole sequences, so N must be 1 (got N=", N,
             "); use kind stateflow to cut sequences into chunks");
    Schedule s = make_schedule(ScheduleKind::StateFlow, P, M, 1);
    s.kind = ScheduleKind::OneFOneB;
    return s;
  }
  Schedule s{.kind = kind, .P = P, .M = M, .N = N, .lowered = false, .per_stage = {}};
  for (int r = 0; r < P; ++r)
    s.per_stage.push_back(kind == ScheduleKind::GPipe ? gpipe_stage(r, M, N) : stateflow_stage(r, P, M, N));
  return s;
}

Schedule make_schedule(std::string_view kind, int P, int M, int N) {
  return make_schedule(parse_schedule_kind(kind), P, M, N);
}

std::string to_text(const Schedule& s) {
  std::string out =
      cat("schedule ", kind_name(s.kind), " P=", s.P, " M=", s.M, " N=", s.N, s.lowered ? " lowered" : "", "\n");
  for (int r = 0; r < static_cast<int>(s.per_stage.size()); ++r) {
    out += cat("stage ", r, ":");
    for (const Action& a : s.per_stage[r]) out.append(" ").append(to_token(a));
    out += "\n";
  }
  return out;
}

namespace {

struct Word {
  std::string_view text;
  int column;  // 1-based
};

std::vector<Word> split_words(std::string_view line) {
  std::vector<Word> words;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
    size_t start = i;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t' && line[i] != '\r') ++i;
    if (i > start) words.push_back({line.substr(start, i - start), static_cast<int>(start) + 1});
  }
  return words;
}

// Reads a non-negative decimal integer at text[pos], advancing pos; false if there is none.
bool read_int(std::string_view text, size_t& pos, int& value) {
  const char* first = text.data() + pos;
  auto [end, ec] = std::from_chars(first, text.data() + text.size(), value);
  if (ec != std::errc() || end == first || *first == '-' || *first == '+') return false;
  pos += end - first;
  return true;
}

[[noreturn]] void fail_at(int line, const Word& word, const std::string& problem) {
  fail("schedule text, line ", line, ", column ", word.column, ", token '", word.text, "': ", problem);
}

// Parses an action token; returns an empty string or why the token is not one.
std::string parse_action(std::string_view t, int stage, Action& a) {
  const std::string expected = "expected Fm.c, Bm.c, sFm.c>q, rFm.c<q, sBm.c>q or rBm.c<q";
  size_t i = 0;
  a = Action{.stage = stage};
  if (i < t.size() && (t[i] == 's' || t[i] == 'r')) a.op = t[i++] == 's' ? Op::Send : Op::Recv;
  if (i >= t.size() || (t[i] != 'F' && t[i] != 'B')) return expected;
  const bool forward = t[i++] == 'F';
  if (a.op == Op::Send || a.op == Op::Recv)
    a.payload = forward ? Payload::Activation : Payload::Gradient;
  else
    a.op = forward ? Op::Forward : Op::Backward;
  if (!read_int(t, i, a.microbatch) || i >= t.size() || t[i++] != '.' || !read_int(t, i, a.chunk)) return expected;
  if (a.op == Op::Send || a.op == Op::Recv) {
    const char arrow = a.op == Op::Send ? '>' : '<';
    if (i >= t.size() || t[i++] != arrow || !read_int(t, i, a.peer)) return expected;
  }
  if (i != t.size()) return expected;
  return "";
}

int parse_header_value(int line, const Word& w, std::string_view key) {
  size_t pos = key.size();
  int value = 0;
  if (!w.text.starts_with(key) || !read_int(w.text, pos, value) || pos != w.text.size())
    fail_at(line, w, cat("expected ", key, "<number>"));
  return value;
}

}  // namespace

Schedule parse_schedule_text(std::string_view text) {
  Schedule s;
  bool have_header = false;
  int line_no = 0;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(begin, end - begin);
    begin = end + 1;
    ++line_no;
    const std::vector<Word> words = split_words(line);
    if (words.empty() || words[0].text.starts_with('#')) continue;

    if (!have_header) {
      if (words[0].text != "schedule" || words.size() < 5 || words.size() > 6)
        fail_at(line_no, words[0], "expected the header 'schedule <kind> P=<stages> M=<microbatches> N=<chunks>'");
      try {
        s.kind = parse_schedule_kind(words[1].text);
      } catch (const Error& e) {
        fail_at(line_no, words[1], e.what());
      }
      s.P = parse_header_value(line_no, words[2], "P=");
      s.M = parse_header_value(line_no, words[3], "M=");
      s.N = parse_header_value(line_no, words[4], "N=");
      if (words.size() == 6) {
        if (words[5].text != "lowered") fail_at(line_no, words[5], "expected 'lowered' or the end of the header");
        s.lowered = true;
      }
      try {
        check_shape(s.P, s.M, s.N);
      } catch (const Error& e) {
        fail_at(line_no, words[0], e.what());
      }
      have_header = true;
      continue;
    }

    const int r = static_cast<int>(s.per_stage.size());
    if (words[0].text != "stage" || words.size() < 2 || words[1].text != cat(r, ":"))
      fail_at(line_no, words[0], cat("expected 'stage ", r, ":' (stages are listed in order, one line each)"));
    if (r >= s.P) fail_at(line_no, words[1], cat("more stage lines than P=", s.P));
    std::vector<Action>& actions = s.per_stage.emplace_back();
    for (size_t i = 2; i < words.size(); ++i) {
      Action a;
      if (std::string problem = parse_action(words[i].text, r, a); !problem.empty())
        fail_at(line_no, words[i], problem);
      if (a.microbatch >= s.M)
        fail_at(line_no, words[i], cat("microbatch ", a.microbatch, " is out of range (M=", s.M, ")"));
      if (a.chunk >= s.N) fail_at(line_no, words[i], cat("chunk ", a.chunk, " is out of range (N=", s.N, ")"));
      if (!is_compute(a)) {
        if (!s.lowered)
          fail_at(line_no, words[i],
                  "sends and receives appear only in lowered schedules; add 'lowered' to the header");
        if (a.peer >= s.P || a.peer == r)
          fail_at(line_no, words[i], cat("peer stage ", a.peer, " must be another stage in 0..", s.P - 1));
      }
      actions.push_back(a);
    }
  }
  SF_CHECK(have_header, "schedule text has no header line 'schedule <kind> P=<stages> M=<microbatches> N=<chunks>'");
  SF_CHECK(static_cast<int>(s.per_stage.size()) == s.P, "schedule text, line ", line_no, ": expected ", s.P,
           " stage lines (P=", s.P, "), found ", s.per_stage.size());
  return s;
}

}  // namespace stateflow
