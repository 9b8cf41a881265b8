// Benchmark of building a model on the host: the time a pipeline stage spends making its
// layers (allocating weights and grads, drawing the initial weights) before any step, per
// build and per parameter. A GPU stage does exactly this, makes bf16 copies of the GEMM
// weights on the host (timed here too) and moves everything over (not timed here); `stateflow
// bench` builds its model once per process.
//
//   model_build_bench [--preset gdn-1.3b] [--layers BEGIN:END] [--reps 3] [--dtype f32|f64]
//                     [--draw-threads N]
//
// --layers: only layers [BEGIN, END) of the flat list (0 = embedding, last = LM head), e.g.
// one stage's share, when the whole model does not fit in host memory. Prints each build's
// seconds, then the median. Then the draw alone: fill_normal of 64M values.
// --draw-threads: the threads that draw (and cast) the pieces of one tensor (default: every
// core); 1 draws each tensor on its layer's thread, as before the draw was cut into pieces
// (the layers are still built on several threads, and the values are the same either way).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "core/rng.h"
#include "model/model.h"
#include "model/param.h"

using namespace stateflow;
using Clock = std::chrono::steady_clock;

static double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main(int argc, char** argv) {
  std::string preset = "gdn-1.3b", layers, dtype = "f32";
  int reps = 3, draw_threads = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--preset" && has_value) preset = argv[++i];
    else if (a == "--layers" && has_value) layers = argv[++i];
    else if (a == "--reps" && has_value) reps = std::atoi(argv[++i]);
    else if (a == "--dtype" && has_value) dtype = argv[++i];
    else if (a == "--draw-threads" && has_value) draw_threads = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "model_build_bench: unknown option '%s' (see the usage at the top of the file)\n", a.c_str());
      return 2;
    }
  }
  if (draw_threads < 0) {
    std::fprintf(stderr, "model_build_bench: --draw-threads takes a count >= 1 (0: every core)\n");
    return 2;
  }
  set_parallel_for_max_threads(draw_threads);
  try {
    const ModelConfig cfg = model_preset(preset);
    const DType type = parse_dtype(dtype);
    int begin = 0, end = Model::num_layers_of(cfg);
    if (!layers.empty() && std::sscanf(layers.c_str(), "%d:%d", &begin, &end) != 2) {
      std::fprintf(stderr, "model_build_bench: --layers takes BEGIN:END, e.g. 0:25\n");
      return 2;
    }
    std::vector<double> builds, casts;
    int64_t params = 0, cast_params = 0;
    for (int r = 0; r < std::max(reps, 1); ++r) {
      auto t0 = Clock::now();
      Model m(cfg, type, begin, end);
      builds.push_back(seconds_since(t0));
      params = cast_params = 0;
      for (Param* p : m.params()) params += p->value.numel();
      // What a GPU build adds on the host: the bf16 copies of the GEMM weights (move_param_to).
      t0 = Clock::now();
      for (Param* p : m.params())
        if (p->gemm_operand) cast_params += p->value.cast(DType::BF16).numel();
      casts.push_back(seconds_since(t0));
      std::printf("build %d: %.3f s, bf16 copies %.3f s\n", r + 1, builds.back(), casts.back());
    }
    const double s = median(builds), c = median(casts);
    std::printf("model %s layers [%d, %d) %s, draw threads %s: %.1fM parameters, median build %.3f s (%.2f ns per "
                "parameter)\n",
                preset.c_str(), begin, end, dtype.c_str(),
                draw_threads ? std::to_string(draw_threads).c_str() : "every core", params / 1e6, s,
                s * 1e9 / double(params));
    std::printf("bf16 copies of %.1fM GEMM weights: median %.3f s (%.2f ns per parameter)\n", cast_params / 1e6, c,
                cast_params ? c * 1e9 / double(cast_params) : 0.0);
    Tensor t = Tensor::zeros({int64_t(1) << 26}, type, MemCategory::Weights);
    Rng rng(1);
    const auto t0 = Clock::now();
    fill_normal(t, rng, 0.02);
    const double fill = seconds_since(t0);
    std::printf("fill_normal of %lld values: %.3f s (%.2f ns per value)\n", (long long)t.numel(), fill,
                fill * 1e9 / double(t.numel()));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "model_build_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
