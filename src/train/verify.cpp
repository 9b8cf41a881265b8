#include "train/verify.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ostream>

#include <functional>
#include <map>
#include <memory>

#include "model/mixer.h"
#include "pipeline/launch.h"
#include "pipeline/chunking.h"
#include "model/optimizer.h"
#include "train/step.h"

namespace stateflow {

constexpr double kVerifyLr = 1e-3;  // the update's learning rate: any positive one shows it

std::vector<std::pair<std::string, std::vector<int64_t>>> builtin_chunkings(int64_t T, int64_t C) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (int64_t n : {2, 3, 4, 8})
    if (n <= T) out.push_back({"N=" + std::to_string(n) + " even", even_chunk_lengths(T, n)});
  if (T >= 4) {
    // uneven: one long chunk between short ones
    int64_t a = std::max<int64_t>(1, T / 8), b = std::max<int64_t>(1, T / 5);
    out.push_back({"uneven", {a, T - a - b, b}});
  }
  if (T > C + 2) out.push_back({"unaligned to C", {C + 1, T - (C + 1) - 1, 1}});
  if (T >= 5) out.push_back({"short 1,1,2,..", {1, 1, 2, T - 4}});
  out.push_back({"1 token each", std::vector<int64_t>(T, 1)});
  return out;
}

// The mean errors leave out the per-head scalars (decay logs, gate biases: under 64 entries).
// Such a parameter's gradient is a sum over every token that cancels to a small net (hundreds
// of times below its terms), so its normwise error is that cancellation times one bf16 rounding,
// drawn anew by every chunking: one at 0.8 of its net doubles a mean of ~0.012 over 40
// parameters. A lost or doubled boundary state still moves the tensors' mean far more than 2x,
// and the table's per-parameter rows and the max still show the scalars.
constexpr int64_t kMeanMinEntries = 64;
static bool in_the_mean(const Param& p) { return p.value.numel() >= kMeanMinEntries; }

// The differences of one run's loss and gradients from the reference's. `reduce` combines a
// parameter's value over the processes (each parameter lives on one; the others give 0).
static VerifyColumn measure(std::string label, std::vector<int64_t> lengths, double loss, double ref_loss,
                            const std::vector<Param*>& ref, const std::map<std::string, Param*>& owned,
                            const std::function<double(double)>& reduce) {
  VerifyColumn col;
  col.label = std::move(label);
  col.lengths = std::move(lengths);
  col.loss_diff = std::fabs(loss - ref_loss) / std::max(std::fabs(ref_loss), 1e-300);
  double sum = 0;
  int64_t counted = 0;
  for (Param* r : ref) {
    auto it = owned.find(r->name);
    col.grad_diffs.push_back(reduce(it == owned.end() ? 0.0 : max_rel_diff(it->second->grad, r->grad)));
    col.max_grad_diff = std::max(col.max_grad_diff, col.grad_diffs.back());
    if (in_the_mean(*r)) sum += col.grad_diffs.back(), ++counted;
  }
  col.mean_grad_diff = counted == 0 ? 0.0 : sum / double(counted);
  return col;
}

static std::map<std::string, Param*> by_name(const std::vector<Param*>& params) {
  std::map<std::string, Param*> out;
  for (Param* p : params) out[p->name] = p;
  return out;
}

// The step the trainer would make from these gradients: clipped to the global norm, then AdamW.
static void clipped_update(std::vector<Param*>& params, const PipelineConfig& pc) {
  const double norm = std::sqrt(grad_sq_sum(params));
  if (norm > pc.clip) scale_grads(params, pc.clip / norm);
  AdamW(params, pc.adamw).step(kVerifyLr);
}

// The weights after the update against the reference's updated weights, into col.
static void measure_update(VerifyColumn& col, const std::vector<Param*>& ref_updated,
                           const std::map<std::string, Param*>& owned, const std::function<double(double)>& reduce) {
  double sum = 0;
  int64_t counted = 0;
  for (Param* r : ref_updated) {
    auto it = owned.find(r->name);
    const double d = reduce(it == owned.end() ? 0.0 : max_rel_diff(it->second->value, r->value));
    col.update_diff = std::max(col.update_diff, d);
    if (in_the_mean(*r)) sum += d, ++counted;
  }
  col.mean_update_diff = counted == 0 ? 0.0 : sum / double(counted);
}

// The loss error bound against the float64 run: twice the unsplit run's, floored at 1e-3. The
// loss is one number, so its bf16 error is one random draw: the unsplit run's can be small by
// chance (on an H200, 1.2e-4 while chunks 1,1,2,296 drew 5.5e-4; all within the bf16 band).
// The gradients' mean error, over the tensors, carries the 2x test: a lost or doubled
// boundary state puts O(1) errors into several gradients.
static double f64_loss_bound(const VerifyColumn& unsplit) { return 2 * std::max(unsplit.loss_diff, 1e-3); }

VerifyResult run_verify(const VerifyOptions& opts) {
  SF_CHECK(opts.batch >= 1 && opts.seq_len >= 1, "verify: --batch and --seq-len must be at least 1");
  SF_CHECK(opts.tolerance >= 0 && std::isfinite(opts.tolerance),
           "verify: --tolerance must be a positive, finite relative difference, got ", opts.tolerance);
  VerifyResult r;
  r.against_f64 = opts.against_f64 || opts.device == Device::CUDA;
  SF_CHECK(!r.against_f64 || opts.tolerance == 0,
           "verify: --tolerance sets the bound of CPU runs; on the GPU each chunking is held to twice the unsplit "
           "run's error against the float64 CPU run: leave --tolerance out");
  const int layers = Model::num_layers_of(opts.model);
  Model model(opts.model, opts.dtype, 0, layers, opts.device);
  DataConfig dc = opts.data;
  if (dc.kind == "recall" && dc.vocab_size == 0) dc.vocab_size = opts.model.vocab_size;
  if (dc.kind == "recall" && 2 * (dc.recall.num_pairs + dc.recall.num_queries) > opts.seq_len) {
    // Fit the task to a short verification sequence.
    dc.recall.num_pairs = std::max<int64_t>(1, opts.seq_len / 8);
    dc.recall.num_queries = std::max<int64_t>(1, opts.seq_len / 6);
  }
  auto data = make_data_source(dc);
  SF_CHECK(data->vocab_size() <= opts.model.vocab_size, "verify: the data uses ", data->vocab_size(),
           " token ids but the model's vocab_size is ", opts.model.vocab_size);
  Batch batch = data->next(opts.batch, opts.seq_len);

  std::vector<Param*> params = model.params();
  for (Param* p : params) r.param_names.push_back(p->name);
  r.tolerance = opts.tolerance > 0 ? opts.tolerance : opts.dtype == DType::F64 ? 1e-10 : 1e-4;

  zero_grads(params);
  const double unsplit_loss = forward_backward(model, batch, 1, {opts.seq_len}).loss;
  PipelineConfig pc;
  // The reference: the unsplit run itself, or the float64 CPU run of its weights.
  std::vector<Param*> ref = params;
  double ref_loss = unsplit_loss;
  std::unique_ptr<Model> exact;
  auto same_everywhere = [](double v) { return v; };
  if (r.against_f64) {
    exact = std::make_unique<Model>(opts.model, DType::F64, 0, layers, Device::CPU);
    ref = exact->params();
    for (size_t i = 0; i < ref.size(); ++i) ref[i]->value.copy_from(params[i]->value.to(Device::CPU).cast(DType::F64));
    zero_grads(ref);
    ref_loss = forward_backward(*exact, batch, 1, {opts.seq_len}).loss;
    r.unsplit = measure("unsplit", {opts.seq_len}, unsplit_loss, ref_loss, ref, by_name(params), same_everywhere);
  }
  // The reference's update, on a copy of its weights so that its gradients stay as they are.
  Model updated(opts.model, r.against_f64 ? DType::F64 : opts.dtype, 0, layers,
                r.against_f64 ? Device::CPU : opts.device);
  std::vector<Param*> ref_updated = updated.params();
  for (size_t i = 0; i < ref.size(); ++i)
    ref_updated[i]->value.copy_from(ref[i]->value), ref_updated[i]->grad.copy_from(ref[i]->grad);
  clipped_update(ref_updated, pc);
  if (r.against_f64) {
    clipped_update(params, pc);  // the unsplit run's gradients are measured: update its weights
    measure_update(r.unsplit, ref_updated, by_name(params), same_everywhere);
  }

  std::vector<std::pair<std::string, std::vector<int64_t>>> cases;
  if (opts.chunkings.empty())
    cases = builtin_chunkings(opts.seq_len, largest_inner_block(opts.model));
  else
    for (auto& l : opts.chunkings) cases.push_back({"N=" + std::to_string(l.size()), l});

  pc.model = opts.model;
  pc.dtype = opts.dtype;
  pc.device = opts.device;
  pc.stages = opts.stages;
  pc.data_parallel = opts.data_parallel;
  pc.microbatches = opts.microbatches;
  pc.schedule = parse_schedule_kind(opts.schedule);
  pc.timeout_s = opts.timeout_s;
  pc.recompute = opts.recompute;
  pc.split_sms = opts.split_sms;
  for (auto& [label, lengths] : cases) {
    validate_chunk_lengths(lengths, opts.seq_len);
    pc.chunk_lengths = lengths;
    auto pipeline = make_pipeline(pc, opts.transport);
    r.report = is_reporting_rank(*pipeline);
    const double loss = pipeline->forward_backward(batch).loss;
    std::vector<Param*> owned;
    for (Stage* s : pipeline->stages())
      for (Param* p : s->model().params()) owned.push_back(p);
    auto over_processes = [&](double v) { return pipeline->max_over_processes(v); };
    VerifyColumn col = measure(label, lengths, loss, ref_loss, ref, by_name(owned), over_processes);
    pipeline->clip_and_update(kVerifyLr, pipeline->grad_norm());
    measure_update(col, ref_updated, by_name(owned), over_processes);
    col.passed = r.against_f64 ? col.loss_diff <= f64_loss_bound(r.unsplit) &&
                                     col.mean_grad_diff <= 2 * r.unsplit.mean_grad_diff &&
                                     col.mean_update_diff <= 2 * r.unsplit.mean_update_diff
                               : col.loss_diff <= r.tolerance && col.max_grad_diff <= r.tolerance &&
                                     col.update_diff <= r.tolerance;
    r.max_rel_grad_diff = std::max(r.max_rel_grad_diff, col.max_grad_diff);
    r.max_rel_update_diff = std::max(r.max_rel_update_diff, col.update_diff);
    r.max_rel_loss_diff = std::max(r.max_rel_loss_diff, col.loss_diff);
    r.columns.push_back(std::move(col));
  }
  return r;
}

void print_verify(const VerifyResult& r, std::ostream& os) {
  if (!r.report) return;
  // Against float64, the unsplit run comes first as column [u]: the error each chunking is held to.
  std::vector<std::pair<std::string, const VerifyColumn*>> shown;
  if (r.against_f64) shown.push_back({"[u]", &r.unsplit});
  for (size_t c = 0; c < r.columns.size(); ++c) shown.push_back({cat("[", c, "]"), &r.columns[c]});
  os << (r.against_f64 ? "errors against the float64 CPU run of the same weights and batch, of the unsplit run [u] "
                         "(one stage, one chunk) and of each chunking:\n"
                       : "chunkings (each compared with one stage, one chunk of the whole sequence):\n");
  for (auto& [tag, col] : shown) {
    std::string l = format_chunk_lengths(col->lengths);
    if (l.size() > 60) l = l.substr(0, 57) + "...";
    os << "  " << tag << " " << col->label << ": " << l << "\n";
  }
  char buf[64];
  const std::string update_row = "weights after update";
  size_t w = update_row.size();
  for (auto& n : r.param_names) w = std::max(w, n.size());
  os << std::string(w, ' ');
  for (auto& [tag, col] : shown) {
    std::snprintf(buf, sizeof buf, "  %9s", tag.c_str());
    os << buf;
  }
  os << "\n";
  auto row = [&](const std::string& name, auto value) {
    os << name << std::string(w - name.size(), ' ');
    for (auto& [tag, col] : shown) {
      std::snprintf(buf, sizeof buf, "  %9.2e", value(*col));
      os << buf;
    }
    os << "\n";
  };
  row("loss", [](const VerifyColumn& c) { return c.loss_diff; });
  for (size_t i = 0; i < r.param_names.size(); ++i)
    row(r.param_names[i], [i](const VerifyColumn& c) { return c.grad_diffs[i]; });
  row(update_row, [](const VerifyColumn& c) { return c.update_diff; });
  if (r.against_f64) {
    row("mean gradient", [](const VerifyColumn& c) { return c.mean_grad_diff; });
    row("mean weight after", [](const VerifyColumn& c) { return c.mean_update_diff; });
    double worst_loss = 0, worst_grad = 0, worst_update = 0;
    for (const VerifyColumn& c : r.columns) {
      worst_loss = std::max(worst_loss, c.loss_diff), worst_grad = std::max(worst_grad, c.mean_grad_diff);
      worst_update = std::max(worst_update, c.mean_update_diff);
    }
    os << (r.passed() ? "PASS" : "FAIL") << ": against float64, the chunkings' worst loss error " << worst_loss
       << " (bound " << f64_loss_bound(r.unsplit) << "), mean gradient error " << worst_grad << " (bound "
       << 2 * r.unsplit.mean_grad_diff << ") and mean weight error after the update " << worst_update << " (bound "
       << 2 * r.unsplit.mean_update_diff << "); the unsplit run's: loss " << r.unsplit.loss_diff
       << ", mean gradient " << r.unsplit.mean_grad_diff << ", mean weight " << r.unsplit.mean_update_diff
       << ". Each chunking may have at most twice the unsplit run's error\n";
  } else {
    std::snprintf(buf, sizeof buf, "%.3e", r.tolerance);
    os << (r.passed() ? "PASS" : "FAIL") << ": max relative loss difference " << r.max_rel_loss_diff
       << ", max relative gradient difference " << r.max_rel_grad_diff << ", max relative weight difference after "
       << "one AdamW step " << r.max_rel_update_diff << " (tolerance " << buf << ")\n";
  }
  std::snprintf(buf, sizeof buf, "%.3e", r.max_rel_grad_diff);
  os << "max_rel_grad_diff=" << buf << "\n";
}

}  // namespace stateflow
