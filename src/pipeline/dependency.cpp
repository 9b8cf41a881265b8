#include "pipeline/dependency.h"

#include "core/error.h"

namespace stateflow {

Prerequisites prerequisites(const Action& a, int P, int N) {
  SF_CHECK(is_compute(a), "prerequisites() takes a forward or backward action, got ", to_token(a));
  Prerequisites p;
  auto add = [&](Op op, int chunk, int stage) {
    p.items[p.count++] = Action{.op = op, .microbatch = a.microbatch, .chunk = chunk, .stage = stage};
  };
  if (a.op == Op::Forward) {
    if (a.stage > 0) add(Op::Forward, a.chunk, a.stage - 1);
    if (a.chunk > 0) add(Op::Forward, a.chunk - 1, a.stage);
  } else {
    if (a.stage < P - 1) add(Op::Backward, a.chunk, a.stage + 1);
    if (a.chunk < N - 1) add(Op::Backward, a.chunk + 1, a.stage);
    add(Op::Forward, a.chunk, a.stage);
  }
  return p;
}

std::vector<std::vector<int>> consumer_stages(int P, int M, int N) {
  std::vector<std::vector<int>> consumers(2 * P * M * N);
  for (int r = 0; r < P; ++r)  // ascending, so each list comes out sorted
    for (Op op : {Op::Forward, Op::Backward})
      for (int m = 0; m < M; ++m)
        for (int c = 0; c < N; ++c)
          for (const Action& need : prerequisites({.op = op, .microbatch = m, .chunk = c, .stage = r}, P, N))
            if (need.stage != r) consumers[compute_index(need, M, N)].push_back(r);
  return consumers;
}

}  // namespace stateflow
