// Benchmark of the CUDA building blocks other than the GDN core: the bf16 GEMM ceiling
// through cuBLAS (the denominator of the model's MFU), and each fused kernel's time and
// achieved bandwidth at T tokens x D model width, against a device-to-device copy.
// CUDA events, warm-up, median of repeats; random data (never zeros). Then whole training
// steps of a preset (gdn-1.3b unless --train-preset) on one sequence of T tokens (train/cuda/train_step_bench.h): tokens/s,
// model TFLOP/s and MFU against the GEMM ceiling measured above and the datasheet figure.
//
//   kernels_bench [--tokens 32768] [--dim 2048] [--reps 20] [--train-steps 5] [--train-warmup 1]
//                 [--train-preset gdn-1.3b] [--train-chunks 1] [--train-recompute]
//
// Bytes are the fewest each kernel must move (every input read once, every output written
// once; parameters and per-row scalars included); GB/s = those bytes / median time.
// --train-steps 0 leaves the training steps out.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "bench_util.cuh"
#include "kernels/cuda/adamw_cuda.h"
#include "kernels/cuda/cross_entropy_cuda.h"
#include "kernels/cuda/embedding_cuda.h"
#include "mixers/gdn/gdn_gates_cuda.h"
#include "kernels/cuda/gemm_cuda.h"
#include "kernels/cuda/weight_grad_cuda.h"
#include "kernels/cuda/norms_cuda.h"
#include "kernels/cuda/short_conv_cuda.h"
#include "kernels/cuda/swiglu_cuda.h"
#include "model/flops.h"
#include "train/cuda/train_step_bench.h"

namespace {

using bf16 = __nv_bfloat16;
using namespace stateflow;
using namespace stateflow::bench;

template <class T>
__global__ void fill_normal(T* x, int64_t n, float scale, uint64_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = T(scale * hash_normal(uint64_t(i), seed));
}

// Device buffers of random normal values, freed at exit.
std::vector<void*> g_buffers;
uint64_t g_seed = 1;

template <class T>
T* random_buffer(int64_t n, float scale = 1.f) {
  void* p = nullptr;
  CK(cudaMalloc(&p, size_t(std::max<int64_t>(n, 1)) * sizeof(T)));
  g_buffers.push_back(p);
  fill_normal<T><<<4096, 256>>>(static_cast<T*>(p), n, scale, ++g_seed);
  CK(cudaGetLastError());
  return static_cast<T*>(p);
}

void* raw_buffer(size_t bytes) {
  void* p = nullptr;
  CK(cudaMalloc(&p, std::max<size_t>(bytes, 1)));
  g_buffers.push_back(p);
  return p;
}

int32_t* random_ids(int64_t n, int64_t below, std::vector<int32_t>* host = nullptr) {
  std::vector<int32_t> h(n);
  uint64_t s = 0x1234567ull + uint64_t(++g_seed);
  for (auto& x : h) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = int32_t((s >> 33) % uint64_t(below));
  }
  auto* d = static_cast<int32_t*>(raw_buffer(size_t(n) * 4));
  CK(cudaMemcpy(d, h.data(), size_t(n) * 4, cudaMemcpyHostToDevice));
  if (host) *host = h;
  return d;
}

// Median of `reps` event-timed calls after 3 warm-ups, in ms.
double time_ms(const std::function<void()>& fn, int reps) {
  CK(cudaDeviceSynchronize());
  return median_ms(fn, reps);
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

std::string dims(int64_t a, int64_t b) { return std::to_string(a) + " x " + std::to_string(b); }
std::string dims(int64_t a, int64_t b, int64_t c) { return dims(a, b) + " x " + std::to_string(c); }

// H100/H200 SXM datasheet: dense bf16 tensor-core peak, TFLOP/s.
constexpr double kDatasheetTflops = 989.0;

double gib(int64_t bytes) { return double(bytes) / 1073741824.0; }

// Whole training steps of a preset on one sequence of T tokens; MFU against the best and the
// mean of the GEMMs measured at T rows (gemm_tflops) and against the datasheet.
void bench_training(const std::string& preset, int64_t chunks, bool recompute, int64_t T, int64_t D, int warmup,
                    int steps, const std::vector<double>& gemm_tflops) {
  TrainStepBenchOptions o;
  o.model = model_preset(preset);
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
  std::string train_preset = "gdn-1.3b";
  int64_t train_chunks = 1;
  bool train_recompute = false;
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
    else if (a == "--train-chunks") train_chunks = next();
    else if (a == "--train-recompute") train_recompute = true;
    else
      std::fprintf(stderr, "usage: kernels_bench [--tokens 32768] [--dim 2048] [--reps 20] [--train-steps 5] "
                           "[--train-warmup 1] [--train-preset gdn-1.3b] [--train-chunks 1] [--train-recompute]\n"),
          std::exit(2);
  }
  if (T < 1 || D < 1 || reps < 1 || train_steps < 0 || train_warmup < 0 || train_chunks < 1 || train_chunks > T)
    std::fprintf(stderr, "--tokens, --dim, --reps must be >= 1; --train-steps, --train-warmup >= 0; --train-chunks "
                         "in [1, --tokens]\n"),
        std::exit(2);
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, %.0f MiB; T = %lld, D = %lld, median of %d\n", prop.name, prop.multiProcessorCount,
              double(prop.totalGlobalMem) / 1048576.0, (long long)T, (long long)D, reps);

  const int64_t H = 16, dh = D / H, F = 5632, V = 32000, K = 4;

  // Ceiling of the memory-bound kernels: a 2 GiB device-to-device copy (read + write counted).
  {
    const size_t bytes = size_t(1) << 31;
    void* src = random_buffer<float>(int64_t(bytes / 4));
    void* dst = raw_buffer(bytes);
    const double ms = time_ms([&] { CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice)); }, reps);
    report("device-to-device copy", "2 GiB", ms, 2.0 * double(bytes));
  }

  // GEMM ceiling: bf16 operands, fp32 accumulation, as the layers call them.
  CublasGemm g;
  std::vector<double> gemm_tflops_at_T;  // every GEMM of T rows: the MFU denominators
  for (const auto& shape : {std::pair<int64_t, int64_t>{D, D}, {D, F}, {F, D}})
    for (int64_t rows : {T / 4, T / 2, T}) {
      const int64_t in = shape.first, out = shape.second;
      if (rows < 1) continue;
      bf16* x = random_buffer<bf16>(rows * in);
      bf16* W = random_buffer<bf16>(in * out, 0.02f);
      bf16* y = random_buffer<bf16>(rows * out);
      bf16* dx = random_buffer<bf16>(rows * in);
      float* dW = random_buffer<float>(in * out);
      const double flops = 2.0 * double(rows) * double(in) * double(out);
      const double elems = double(rows * in + in * out + rows * out);
      const std::string s = dims(rows, in, out);
      report("gemm fwd  y = x W (bf16 out)", s,
             time_ms([&] { linear_forward_cuda<bf16, bf16>(g, x, W, y, rows, in, out); }, reps), 2 * elems, flops);
      report("gemm bwd  dx += dy W^T (bf16)", s,
             time_ms([&] { linear_backward_data_cuda<bf16, bf16>(g, y, W, dx, rows, in, out); }, reps), 2 * elems + 2 * rows * in, flops);
      const WeightGradOperands<bf16> ops{x, in, rows * in, y, out, rows * out};
      report("gemm bwd  dW += x^T dy (2048-token steps)", s,
             time_ms([&] { weight_grad_cuda<bf16>(g, ops, dW, 1, rows, in, out); }, reps),
             2.0 * double(rows * in + rows * out) + 8.0 * double(in * out) * double((rows + 2047) / 2048), flops);
      report("gemm bwd  dW += x^T dy (one call, ref)", s,
             time_ms([&] { gemm_cuda<bf16, float>(g, true, false, in, out, rows, 1.f, x, in, y, out, 1.f, dW, out); }, reps),
             2.0 * double(rows * in + rows * out) + 8.0 * double(in * out), flops);
      CK(cudaDeviceSynchronize());
      for (int k = 0; k < 5; ++k) cudaFree(g_buffers.back()), g_buffers.pop_back();
      if (rows == T)
        for (size_t k = g_rows.size() - 4; k + 1 < g_rows.size(); ++k)  // the model's three, not the reference
          gemm_tflops_at_T.push_back(g_rows[k].flops / g_rows[k].ms / 1e9);
    }

  // Fused kernels at T x D (bf16 activations, fp32 parameters and gradients).
  const double N = double(T) * double(D);
  {
    std::vector<int32_t> host_ids;
    int32_t* ids = random_ids(T, V, &host_ids);
    float* table = random_buffer<float>(V * D);
    float* dtable = random_buffer<float>(V * D);
    bf16* out = random_buffer<bf16>(T * D);
    void* ws = raw_buffer(embedding_backward_workspace_bytes(T));
    const double distinct = double(std::set<int32_t>(host_ids.begin(), host_ids.end()).size());
    const std::string s = dims(T, D) + ", V " + std::to_string(V);
    report("embedding fwd", s, time_ms([&] { embedding_forward_cuda<bf16>(ids, table, out, T, D, V, nullptr, nullptr); }, reps),
           4.0 * T + 4.0 * distinct * D + 2 * N);
    report("embedding bwd (sort + owned rows)", s,
           time_ms([&] { embedding_backward_cuda<bf16>(ids, out, dtable, T, D, V, 1, ws, nullptr); }, reps),
           4.0 * T + 2 * N + 8.0 * distinct * D);
  }
  {
    bf16 *x = random_buffer<bf16>(T * D), *y = random_buffer<bf16>(T * D), *dy = random_buffer<bf16>(T * D);
    bf16* dx = random_buffer<bf16>(T * D);
    float *w = random_buffer<float>(D), *dw = random_buffer<float>(D), *rstd = random_buffer<float>(T);
    void* ws = raw_buffer(norm_backward_workspace_bytes(T, D, TokenRows{}));
    const std::string s = dims(T, D);
    report("rmsnorm fwd", s, time_ms([&] { rmsnorm_forward_cuda<bf16>(x, w, y, rstd, T, D, 1e-5, nullptr); }, reps),
           4 * N + 4.0 * T);
    report("rmsnorm bwd", s,
           time_ms([&] { rmsnorm_backward_cuda<bf16>(x, w, rstd, dy, dx, dw, T, D, TokenRows{}, ws, nullptr); }, reps),
           6 * N + 4.0 * T);
    // Per head: rows T x H of width dh (the GDN output norm and the q/k normalisation).
    const int64_t rows = T * H;
    bf16* z = random_buffer<bf16>(T * D);
    bf16* dz = random_buffer<bf16>(T * D);
    float *wh = random_buffer<float>(dh), *dwh = random_buffer<float>(dh), *rstd_h = random_buffer<float>(rows);
    void* ws_h = raw_buffer(norm_backward_workspace_bytes(rows, dh, TokenRows{1, rows / T}));
    const std::string sh = dims(rows, dh);
    report("gated_rmsnorm fwd", sh,
           time_ms([&] { gated_rmsnorm_forward_cuda<bf16>(x, z, wh, y, rstd_h, rows, dh, 1e-5, nullptr); }, reps),
           6 * N + 4.0 * rows);
    report("gated_rmsnorm bwd", sh,
           time_ms([&] { gated_rmsnorm_backward_cuda<bf16>(x, z, wh, rstd_h, dy, dx, dz, dwh, rows, dh, TokenRows{1, rows / T}, ws_h, nullptr); }, reps),
           10 * N + 4.0 * rows);
    report("l2norm fwd", sh, time_ms([&] { l2norm_forward_cuda<bf16>(x, y, rstd_h, rows, dh, 1e-6, nullptr); }, reps),
           4 * N + 4.0 * rows);
    report("l2norm bwd", sh, time_ms([&] { l2norm_backward_cuda<bf16>(y, rstd_h, dy, dx, rows, dh, nullptr); }, reps),
           6 * N + 4.0 * rows);
    // Short conv over one projection (ch = D), with a carried prefix.
    bf16 *prefix = random_buffer<bf16>((K - 1) * D), *prefix_out = random_buffer<bf16>((K - 1) * D);
    float *cw = random_buffer<float>(D * K, 0.5f), *dcw = random_buffer<float>(D * K);
    float *dpo = random_buffer<float>((K - 1) * D), *dpi = random_buffer<float>((K - 1) * D);
    void* ws_c = raw_buffer(short_conv_backward_workspace_bytes(1, T, D, K));
    const std::string sc = dims(T, D) + ", K " + std::to_string(K);
    report("short_conv fwd", sc,
           time_ms([&] { short_conv_forward_cuda<bf16>(x, prefix, cw, y, prefix_out, 1, T, D, K, nullptr); }, reps),
           4 * N);
    report("short_conv bwd", sc,
           time_ms([&] { short_conv_backward_cuda<bf16>(x, prefix, cw, dy, dpo, dx, dpi, dcw, 1, T, D, K, ws_c, nullptr); }, reps),
           6 * N);
  }
  {
    bf16 *a = random_buffer<bf16>(T * F), *b = random_buffer<bf16>(T * F), *h = random_buffer<bf16>(T * F);
    bf16 *da = random_buffer<bf16>(T * F), *db = random_buffer<bf16>(T * F);
    const double n = double(T) * double(F);
    const std::string s = dims(T, F);
    report("swiglu fwd", s, time_ms([&] { swiglu_forward_cuda<bf16>(a, b, h, T * F, nullptr); }, reps), 6 * n);
    report("swiglu bwd", s, time_ms([&] { swiglu_backward_cuda<bf16>(a, b, h, da, db, T * F, nullptr); }, reps), 10 * n);
    CK(cudaDeviceSynchronize());
    for (int k = 0; k < 5; ++k) cudaFree(g_buffers.back()), g_buffers.pop_back();
  }
  {
    const int64_t n = T * H;
    bf16 *a = random_buffer<bf16>(n), *b = random_buffer<bf16>(n), *da = random_buffer<bf16>(n), *db = random_buffer<bf16>(n);
    float *A_log = random_buffer<float>(H, 0.5f), *dt = random_buffer<float>(H, 0.5f);
    float *dA = random_buffer<float>(H), *ddt = random_buffer<float>(H);
    float *gg = random_buffer<float>(n), *beta = random_buffer<float>(n), *dg = random_buffer<float>(n);
    float* dbeta = random_buffer<float>(n);
    void* ws = raw_buffer(gdn_gates_backward_workspace_bytes(T, H, 1));
    const std::string s = dims(T, H);
    report("gdn_gates fwd", s, time_ms([&] { gdn_gates_forward_cuda<bf16>(a, b, A_log, dt, gg, beta, T, H, nullptr); }, reps),
           12.0 * n);
    report("gdn_gates bwd", s,
           time_ms([&] { gdn_gates_backward_cuda<bf16>(a, b, A_log, dt, dg, dbeta, da, db, dA, ddt, T, H, 1, ws, nullptr); }, reps),
           16.0 * n);
  }
  {
    const int64_t n = 64ll << 20;  // 64 M parameters
    float *p = random_buffer<float>(n), *gr = random_buffer<float>(n, 1e-3f), *m = random_buffer<float>(n, 1e-3f);
    float* v = random_buffer<float>(n, 1e-3f);
    CK(cudaMemset(v, 0, size_t(n) * 4));  // v >= 0
    bf16* copy = random_buffer<bf16>(n);
    AdamWConfig cfg;
    int64_t step = 0;
    report("adamw step (+ bf16 copy)", std::to_string(n >> 20) + " M params",
           time_ms([&] { adamw_update_cuda(p, gr, m, v, n, 1e-4, 0.1, cfg, ++step, copy, nullptr); }, reps), 30.0 * n);
    CK(cudaDeviceSynchronize());
    for (int k = 0; k < 5; ++k) cudaFree(g_buffers.back()), g_buffers.pop_back();
  }
  {
    const int64_t block_tokens = 4096;  // batch 1: rows per block
    bf16 *x = random_buffer<bf16>(T * D), *W = random_buffer<bf16>(D * V, 0.02f), *dx = random_buffer<bf16>(T * D);
    float* dW = random_buffer<float>(D * V);
    int32_t* targets = random_ids(T, V);
    void* ws = raw_buffer(lm_head_cross_entropy_workspace_bytes<bf16>(1, block_tokens, V));
    auto* stats = static_cast<LossStatsCuda*>(raw_buffer(loss_stats_blocks(1, T) * sizeof(LossStatsCuda)));
    const double gemm = 2.0 * double(T) * double(D) * double(V);
    const std::string s = dims(T, D, V) + ", blocks of " + std::to_string(block_tokens);
    const int r = std::max(3, reps / 4);
    report("lm_head + CE fwd (eval)", s,
           time_ms([&] { lm_head_cross_entropy_cuda<bf16>(g, x, W, targets, 1, T, D, V, 1.f, block_tokens, nullptr, nullptr, stats, ws); }, r),
           0, gemm);
    report("lm_head + CE fwd + bwd", s,
           time_ms([&] { lm_head_cross_entropy_cuda<bf16>(g, x, W, targets, 1, T, D, V, 1.f / T, block_tokens, dx, dW, stats, ws); }, r),
           0, 3 * gemm);
    const LossStats st = add_loss_stats_cuda(stats, 1, T, V, nullptr, nullptr);
    std::printf("  (loss per counted token %.3f: random data, for the NaN check only)\n", st.loss_sum / double(st.counted));
    if (!std::isfinite(st.loss_sum)) std::fprintf(stderr, "non-finite loss\n"), std::exit(1);
    std::printf("  lm_head workspace: %.2f GiB (full logits would be %.2f GiB in fp32)\n",
                double(lm_head_cross_entropy_workspace_bytes<bf16>(1, block_tokens, V)) / 1073741824.0,
                4.0 * double(T) * double(V) / 1073741824.0);
  }
  CK(cudaDeviceSynchronize());

  const double copy_gbs = g_rows[0].bytes / g_rows[0].ms / 1e6;
  std::printf("\n| kernel | shape | ms | GB/s | %% of copy | TFLOP/s |\n|---|---|---:|---:|---:|---:|\n");
  for (const Row& r : g_rows) {
    const double gbs = r.bytes / r.ms / 1e6;
    std::printf("| %s | %s | %.3f | %s | %s | %s |\n", r.kernel.c_str(), r.shape.c_str(), r.ms,
                r.bytes > 0 ? std::to_string(int(gbs + 0.5)).c_str() : "",
                r.bytes > 0 ? std::to_string(int(100 * gbs / copy_gbs + 0.5)).c_str() : "",
                r.flops > 0 ? std::to_string(int(r.flops / r.ms / 1e9 + 0.5)).c_str() : "");
  }
  for (void* p : g_buffers) cudaFree(p);
  g_buffers.clear();
  if (train_steps > 0) {
    try {
      bench_training(train_preset, train_chunks, train_recompute, T, D, train_warmup, train_steps, gemm_tflops_at_T);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "training step: %s\n", e.what());
      return 1;
    }
  }
  return 0;
}
