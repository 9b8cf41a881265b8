// Benchmark switches for the chunk-tax levers (docs/benchmarks.md, "The chunk tax"):
// STATEFLOW_LEVERS_OFF=conv_tiles,norm_rows,gemm_rows,reduce_ahead runs the named levers the
// way the code ran before them, so that one build measures each on and off in one session.
//   conv_tiles    short conv: 64-row tiles in both passes (instead of shorter forward tiles for
//                 short chunks, and 16-row backward tiles summed per 64-token block)
//   norm_rows     RMS norm backward: 16 rows per lane team (instead of 4)
//   gemm_rows     cuBLASLt: the pinned algorithm chosen for 16K rows (instead of 2K)
//   reduce_ahead  token-block reductions: each segment's load waited for (instead of 8 at once)
// Results stay exact and chunk-invariant either way (at the cuts each setting documents).
#pragma once
#include <cstdlib>
#include <string>

namespace stateflow {

inline bool lever_off(const std::string& name) {
  static const std::string off = [] {
    const char* v = std::getenv("STATEFLOW_LEVERS_OFF");
    return "," + std::string(v ? v : "") + ",";
  }();
  return off.find("," + name + ",") != std::string::npos;
}

}  // namespace stateflow
