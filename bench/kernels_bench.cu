// Benchmark of the CUDA building blocks other than the GDN core: the bf16 GEMM ceiling
// through cuBLAS (the denominator of the model's MFU), and each fused kernel's time and
// achieved bandwidth at T tokens x D model width, against a device-to-device copy.
// CUDA events, warm-up, median of repeats; random data (never zeros). Then whole training
// steps of a preset (gdn-1.3b unless --train-preset; or a model config file, --train-config, as stateflow's
// --config: e.g. {"preset": "gdn-1.3b", "gdn": {"keep_sweep": true}}) on one sequence of T tokens
// (train/cuda/train_step_bench.h): tokens/s,
// model TFLOP/s and MFU against the GEMM ceiling measured above and the datasheet figure.
//
//   kernels_bench [--tokens 32768] [--dim 2048] [--reps 20] [--train-steps 5] [--train-warmup 1]
//                 [--train-preset gdn-1.3b] [--train-config FILE] [--train-chunks 1] [--train-recompute]
//                 [--back-to-back] [--ops rmsnorm,short_conv,...]
//
// Every kernel op registered for this program (kernels/op_def.h: OpDef::bench ==
// "kernels_bench"), in name order, at the shapes its definition makes from T, D and the
// model's other sizes, on inputs drawn on the device by its definition, each pass timed; the
// same definitions drive the kernels' test (tests/cuda/test_op_defs_cuda.cpp). Bytes and FLOPs
// are the definition's: bytes the fewest each pass must move (every input read once, every
// output written once, at bf16 activations); GB/s = those bytes / median time.
// --train-steps 0 leaves the training steps out. --back-to-back times each pass as the mean of
// --reps calls issued back to back between one pair of events: the device's time per call when
// it never waits for the host, as a chunk's kernels run in a step (a single call of a small op is
// mostly the host's launch latency). --ops times only the named ops (the copy ceiling always).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.cuh"
#include "kernels/cuda/device_graph_cuda.h"
#include "kernels/cuda/op_buffers.h"
#include "kernels/op_def.h"
#include "model/flops.h"
#include "train/cuda/train_step_bench.h"

namespace {

using bf16 = __nv_bfloat16;
using namespace stateflow;
using namespace stateflow::bench;

bool g_back_to_back = false;  // --back-to-back

// Median of `reps` event-timed calls after 3 warm-ups, in ms; with --back-to-back the mean of
// `reps` calls between one pair of events.
double time_ms(const std::function<void()>& fn, int reps) {
  CK(cudaDeviceSynchronize());
  if (!g_back_to_back) return median_ms(fn, reps);
  return median_ms([&] { for (int i = 0; i < reps; ++i) fn(); }, 1) / reps;
}

struct Row {
  std::string kernel, shape;
  double ms, bytes, flops;
};
std::vector<Row> g_rows;

void report(const std::string& kernel, const std::string& shape, double ms, double bytes, double flops = 0) {
  g_rows.push_back({kernel, shape, ms, bytes, flops});
  std::printf("  %-34s %-34s %9.3f ms\n", kernel.c_str(), shape.c_str(), ms);
  std::fflush(stdout);
}

// H100/H200 SXM datasheet: dense bf16 tensor-core peak, TFLOP/s.
constexpr double kDatasheetTflops = 989.0;

double gib(int64_t bytes) { return double(bytes) / 1073741824.0; }

// Whole training steps of a preset on one sequence of T tokens; MFU against the best and the
// mean of the GEMMs measured at T rows (gemm_tflops) and against the datasheet.
void bench_training(const std::string& preset, const std::string& config, int64_t chunks, bool recompute, int64_t T, int64_t D, int warmup,
                    int steps, const std::vector<double>& gemm_tflops) {
  TrainStepBenchOptions o;
  o.model = config.empty() ? model_preset(preset) : load_model_config(config);
  o.seq_len = T, o.chunks = chunks, o.recompute = recompute, o.warmup_steps = warmup, o.steps = steps;
  const ModelConfig& m = o.model;
  const ModelFlops flops = model_flops_per_token(m, T);
  std::printf("\ntraining step: %s (%.3f B parameters, width %lld, pattern %s, %s, MLP %lld, vocab %lld), batch "
              "%lld x %lld tokens, one stage, %lld equal chunks%s; fp32 master weights, bf16 GEMMs and activations; %d "
              "warm-up + %d timed steps\n",
              m.name.c_str(), double(m.num_parameters()) / 1e9, (long long)m.d_model, m.pattern.c_str(),
              m.mixers.dump().c_str(), (long long)m.mlp_hidden, (long long)m.vocab_size, (long long)o.batch,
              (long long)o.seq_len, (long long)o.chunks, recompute ? ", full recomputation" : "", warmup, steps);
  if (D != m.d_model)
    std::printf("  (note: --dim %lld is not the model's width %lld: the GEMM ceiling was measured at other shapes)\n",
                (long long)D, (long long)m.d_model);
  std::printf("  a step: zero grads, forward + backward, global grad norm, clip, AdamW + bf16 re-cast of the GEMM "
              "weights; the device synchronised after each phase; batches drawn before timing\n");
  std::printf("  FLOPs per token, fwd + bwd, as MATH.md section 9 counts them (matrix products only, multiply-add = 2; "
              "6 per weight of the mixers' projections, MLPs and LM head; GDN core with full C x C tiles; attention "
              "12 x heads x head_dim per key, (T + 1) / 2 keys per token; not counted: embedding lookup, the LM "
              "head's recomputed logits in backward, attention's recomputed scores, element-wise work, the "
              "optimizer): %.3f GFLOP = %.3f dense + %.3f mixer cores\n",
              flops.total() / 1e9, flops.dense / 1e9, flops.core / 1e9);
  std::fflush(stdout);

  const TrainStepBenchResult r = bench_training_steps(o);
  const int n = int(r.steps.size());
  auto mean_of = [&](double StepPhases::*field) {
    double sum = 0;
    for (const StepPhases& s : r.steps) sum += s.*field;
    return sum / n;
  };
  const double mean = mean_of(&StepPhases::total), fwd_bwd = mean_of(&StepPhases::forward_backward);
  const double norm = mean_of(&StepPhases::grad_norm), update = mean_of(&StepPhases::update);
  double lo = r.steps[0].total, hi = lo, var = 0;
  for (const StepPhases& s : r.steps)
    lo = std::min(lo, s.total), hi = std::max(hi, s.total), var += (s.total - mean) * (s.total - mean);
  const double sd = n > 1 ? std::sqrt(var / (n - 1)) : 0.0;
  const double tokens_per_s = double(o.batch * o.seq_len) / mean;
  const double tflops = flops.total() * tokens_per_s / 1e12;
  double best = 0, sum = 0;
  for (double t : gemm_tflops) best = std::max(best, t), sum += t;
  const double gemm_mean = gemm_tflops.empty() ? 0.0 : sum / double(gemm_tflops.size());
  auto pct = [](double part, double whole) { return whole > 0 ? 100.0 * part / whole : 0.0; };

  std::printf("  step               %.4f s mean over %d (min %.4f, max %.4f, std %.4f; (max-min)/mean %.1f %%)\n", mean,
              n, lo, hi, sd, pct(hi - lo, mean));
  std::printf("    fwd + bwd        %.4f s  %5.1f %%\n", fwd_bwd, pct(fwd_bwd, mean));
  std::printf("    grad norm        %.4f s  %5.1f %%\n", norm, pct(norm, mean));
  std::printf("    clip + AdamW     %.4f s  %5.1f %%  (with the bf16 re-cast)\n", update, pct(update, mean));
  std::printf("    optimizer share  %5.1f %%  (grad norm + clip + AdamW)\n", pct(norm + update, mean));
  std::printf("  tokens/s           %.0f\n", tokens_per_s);
  std::printf("  model TFLOP/s      %.1f\n", tflops);
  std::printf("  MFU                %.1f %% of the best GEMM measured above (%.0f TFLOP/s), %.1f %% of their mean "
              "(%zu GEMMs at %lld rows: %.0f TFLOP/s), %.1f %% of the datasheet's %.0f TFLOP/s\n",
              pct(tflops, best), best, pct(tflops, gemm_mean), gemm_tflops.size(), (long long)T, gemm_mean,
              pct(tflops, kDatasheetTflops), kDatasheetTflops);
  std::printf("  losses of the timed steps:");
  for (double l : r.losses) std::printf(" %.4f", l);
  std::printf("\n  peak memory, our allocator (requested bytes by category):");
  const char* sep = " ";
  for (int c = 0; c < kNumMemCategories; ++c)
    if (r.tracked.peak[c])
      std::printf("%s%s %s", sep, mem_category_name(MemCategory(c)), format_bytes(r.tracked.peak[c]).c_str()), sep = ", ";
  std::printf(" | total %.2f GiB; reserved after the steps (in use + cached): %.2f GiB\n", gib(r.tracked.total_peak),
              gib(r.allocator_reserved));
  std::printf("  peak memory, the driver (cudaMemGetInfo, whole device): %.2f GiB in use, %.2f GiB before the model "
              "was built\n", gib(r.driver_used_peak), gib(r.driver_used_before));
  std::printf("\n| tokens/s | step mean (min-max) | optimizer share | model TFLOP/s | of best GEMM (%.0f) | of mean GEMM "
              "(%.0f) | of datasheet (%.0f) | peak memory (allocator / driver) |\n"
              "|---:|---:|---:|---:|---:|---:|---:|---:|\n",
              best, gemm_mean, kDatasheetTflops);
  std::printf("| %.0f | %.3f s (%.3f-%.3f) | %.1f %% | %.1f | %.1f %% | %.1f %% | %.1f %% | %.1f / %.1f GiB |\n",
              tokens_per_s, mean, lo, hi, pct(norm + update, mean), tflops, pct(tflops, best), pct(tflops, gemm_mean),
              pct(tflops, kDatasheetTflops), gib(r.tracked.total_peak), gib(r.driver_used_peak));
}

}  // namespace

int main(int argc, char** argv) {
  int64_t T = 32768, D = 2048;
  int reps = 20, train_steps = 5, train_warmup = 1;
  std::string train_preset = "gdn-1.3b", train_config;
  int64_t train_chunks = 1;
  bool train_recompute = false;
  std::string ops;  // --ops: ",name,name," (empty: every op)
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] {
      if (i + 1 >= argc) std::fprintf(stderr, "%s needs a value\n", a.c_str()), std::exit(2);
      return std::atoll(argv[++i]);
    };
    if (a == "--tokens") T = next();
    else if (a == "--dim") D = next();
    else if (a == "--reps") reps = int(next());
    else if (a == "--train-steps") train_steps = int(next());
    else if (a == "--train-warmup") train_warmup = int(next());
    else if (a == "--train-preset" && i + 1 < argc) train_preset = argv[++i];
    else if (a == "--train-config" && i + 1 < argc) train_config = argv[++i];
    else if (a == "--train-chunks") train_chunks = next();
    else if (a == "--train-recompute") train_recompute = true;
    else if (a == "--back-to-back") g_back_to_back = true;
    else if (a == "--ops" && i + 1 < argc) ops = std::string(",") + argv[++i] + ",";
    else
      std::fprintf(stderr, "usage: kernels_bench [--tokens 32768] [--dim 2048] [--reps 20] [--train-steps 5] "
                           "[--train-warmup 1] [--train-preset gdn-1.3b] [--train-config FILE] [--train-chunks 1] "
                           "[--train-recompute] [--back-to-back] [--ops NAME,...]\n"),
          std::exit(2);
  }
  if (T < 1 || D < 1 || reps < 1 || train_steps < 0 || train_warmup < 0 || train_chunks < 1 || train_chunks > T)
    std::fprintf(stderr, "--tokens, --dim, --reps must be >= 1; --train-steps, --train-warmup >= 0; --train-chunks "
                         "in [1, --tokens]\n"),
        std::exit(2);
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, %.0f MiB; T = %lld, D = %lld, %s of %d\n", prop.name, prop.multiProcessorCount,
              double(prop.totalGlobalMem) / 1048576.0, (long long)T, (long long)D,
              g_back_to_back ? "mean of back-to-back runs" : "median", reps);

  BenchSizes sizes;  // the model's other sizes are gdn-1.3b's
  sizes.tokens = T, sizes.dim = D;

  // Ceiling of the memory-bound kernels: a 2 GiB device-to-device copy (read + write counted).
  {
    const size_t bytes = size_t(1) << 31;
    void *src = nullptr, *dst = nullptr;
    CK(cudaMalloc(&src, bytes));
    CK(cudaMalloc(&dst, bytes));
    CK(cudaMemset(src, 0x3c, bytes));
    const double ms = time_ms([&] { CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice)); }, reps);
    report("device-to-device copy", "2 GiB", ms, 2.0 * double(bytes));
    CK(cudaFree(src));
    CK(cudaFree(dst));
  }

  // Each op at each of its shapes: bf16 activations, fp32 parameters and gradients, as the
  // layers call them. The GEMMs of T rows (the linear op's, not its one-call baseline) are the
  // MFU denominators.
  std::vector<double> gemm_tflops_at_T;
  uint64_t seed = 1;
  for (const OpDef& op : all_ops()) {
    if (op.bench != "kernels_bench" || (!ops.empty() && ops.find("," + op.name + ",") == std::string::npos)) continue;
    const DType act = op.acts.back();  // bf16 where the op runs with it
    for (const OpShape& shape : op.bench_shapes(sizes)) {
      try {
        OpBuffers buf(op, shape, act);
        buf.draw(++seed);
        for (const OpPass& pass : op.passes) {
          const double ms = time_ms([&] { buf.run(pass); }, reps);
          report(op.label + " " + pass.name, op.bench_label(shape), ms, pass.bytes(shape), pass.flops(shape));
          if (op.name == "linear" && !pass.baseline && shape["rows"] == T)
            gemm_tflops_at_T.push_back(pass.flops(shape) / ms / 1e9);
        }
        CK(cudaDeviceSynchronize());
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%s at %s: %s\n", op.name.c_str(), shape.label().c_str(), e.what());
        return 1;
      }
    }
  }
  const double copy_gbs = g_rows[0].bytes / g_rows[0].ms / 1e6;
  std::printf("\n| kernel | shape | ms | GB/s | %% of copy | TFLOP/s |\n|---|---|---:|---:|---:|---:|\n");
  for (const Row& r : g_rows) {
    const double gbs = r.bytes / r.ms / 1e6;
    std::printf("| %s | %s | %.3f | %s | %s | %s |\n", r.kernel.c_str(), r.shape.c_str(), r.ms,
                r.bytes > 0 ? std::to_string(int(gbs + 0.5)).c_str() : "",
                r.bytes > 0 ? std::to_string(int(100 * gbs / copy_gbs + 0.5)).c_str() : "",
                r.flops > 0 ? std::to_string(int(r.flops / r.ms / 1e9 + 0.5)).c_str() : "");
  }
  if (train_steps > 0) {
    try {
      bench_training(train_preset, train_config, train_chunks, train_recompute, T, D, train_warmup, train_steps, gemm_tflops_at_T);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "training step: %s\n", e.what());
      return 1;
    }
    const DeviceGraphCounts g = cuda_graph_counts();
    if (g.launched > 0)
      std::printf("CUDA graphs of the blocks' passes (kernels/cuda/device_graph_cuda.h): %lld launched, %.0f nodes "
                  "each on average, %lld updated in place, %lld instantiated\n",
                  (long long)g.launched, double(g.nodes) / double(g.launched), (long long)g.updated,
                  (long long)g.instantiated);
  }
  return 0;
}
