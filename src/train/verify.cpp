#include "train/verify.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ostream>

#include <map>

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

VerifyResult run_verify(const VerifyOptions& opts) {
  SF_CHECK(opts.batch >= 1 && opts.seq_len >= 1, "verify: --batch and --seq-len must be at least 1");
  Model model(opts.model, opts.dtype, 0, Model::num_layers_of(opts.model), opts.device);
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
  VerifyResult r;
  for (Param* p : params) r.param_names.push_back(p->name);
  // On the GPU, chunking changes how bf16 GEMM results round (cuBLAS picks algorithms by row
  // count); down to 1-token chunks that moves gradients by up to ~3.5e-2 (measured, small preset).
  const double default_tol = opts.device == Device::CUDA ? 5e-2 : opts.dtype == DType::F64 ? 1e-10 : 1e-4;
  r.tolerance = opts.tolerance > 0 ? opts.tolerance : default_tol;

  zero_grads(params);
  const double ref_loss = forward_backward(model, batch, 1, {opts.seq_len}).loss;
  // The update the trainer would make from these gradients (clipped to the global norm), on a
  // second copy of the initial weights so that the reference gradients stay as they are.
  PipelineConfig pc;
  Model updated(opts.model, opts.dtype, 0, Model::num_layers_of(opts.model), opts.device);
  std::vector<Param*> updated_params = updated.params();
  for (size_t i = 0; i < params.size(); ++i) updated_params[i]->grad.copy_from(params[i]->grad);
  const double ref_norm = std::sqrt(grad_sq_sum(updated_params));
  if (ref_norm > pc.clip) scale_grads(updated_params, pc.clip / ref_norm);
  AdamW(updated_params, pc.adamw).step(kVerifyLr);

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
  for (auto& [label, lengths] : cases) {
    validate_chunk_lengths(lengths, opts.seq_len);
    pc.chunk_lengths = lengths;
    auto pipeline = make_pipeline(pc, opts.transport);
    r.report = is_reporting_rank(*pipeline);
    const double loss = pipeline->forward_backward(batch).loss;
    VerifyColumn col;
    col.label = label;
    col.lengths = lengths;
    col.loss_diff = std::fabs(loss - ref_loss) / std::max(std::fabs(ref_loss), 1e-300);
    std::map<std::string, Param*> owned;
    for (Stage* s : pipeline->stages())
      for (Param* p : s->model().params()) owned[p->name] = p;
    for (Param* ref : params) {
      auto it = owned.find(ref->name);
      // Each parameter lives on exactly one stage; other processes contribute 0.
      col.grad_diffs.push_back(
          pipeline->max_over_processes(it == owned.end() ? 0.0 : max_rel_diff(it->second->grad, ref->grad)));
      col.max_grad_diff = std::max(col.max_grad_diff, col.grad_diffs.back());
    }
    pipeline->clip_and_update(kVerifyLr, pipeline->grad_norm());
    for (size_t i = 0; i < params.size(); ++i) {
      auto it = owned.find(params[i]->name);
      col.update_diff = std::max(col.update_diff, pipeline->max_over_processes(
          it == owned.end() ? 0.0 : max_rel_diff(it->second->value, updated_params[i]->value)));
    }
    r.max_rel_grad_diff = std::max(r.max_rel_grad_diff, col.max_grad_diff);
    r.max_rel_update_diff = std::max(r.max_rel_update_diff, col.update_diff);
    r.max_rel_loss_diff = std::max(r.max_rel_loss_diff, col.loss_diff);
    r.columns.push_back(std::move(col));
  }
  return r;
}

void print_verify(const VerifyResult& r, std::ostream& os) {
  if (!r.report) return;
  os << "chunkings (each compared with one stage, one chunk of the whole sequence):\n";
  for (size_t c = 0; c < r.columns.size(); ++c) {
    std::string l = format_chunk_lengths(r.columns[c].lengths);
    if (l.size() > 60) l = l.substr(0, 57) + "...";
    os << "  [" << c << "] " << r.columns[c].label << ": " << l << "\n";
  }
  char buf[64];
  const std::string update_row = "weights after update";
  size_t w = update_row.size();
  for (auto& n : r.param_names) w = std::max(w, n.size());
  os << std::string(w, ' ');
  for (size_t c = 0; c < r.columns.size(); ++c) {
    std::snprintf(buf, sizeof buf, "  %9s", cat("[", c, "]").c_str());
    os << buf;
  }
  os << "\n";
  auto row = [&](const std::string& name, auto value) {
    os << name << std::string(w - name.size(), ' ');
    for (size_t c = 0; c < r.columns.size(); ++c) {
      std::snprintf(buf, sizeof buf, "  %9.2e", value(r.columns[c]));
      os << buf;
    }
    os << "\n";
  };
  row("loss", [](const VerifyColumn& c) { return c.loss_diff; });
  for (size_t i = 0; i < r.param_names.size(); ++i)
    row(r.param_names[i], [i](const VerifyColumn& c) { return c.grad_diffs[i]; });
  row(update_row, [](const VerifyColumn& c) { return c.update_diff; });
  std::snprintf(buf, sizeof buf, "%.3e", r.tolerance);
  os << (r.passed() ? "PASS" : "FAIL") << ": max relative loss difference " << r.max_rel_loss_diff
     << ", max relative gradient difference " << r.max_rel_grad_diff << ", max relative weight difference after "
     << "one AdamW step " << r.max_rel_update_diff << " (tolerance " << buf << ")\n";
  std::snprintf(buf, sizeof buf, "%.3e", r.max_rel_grad_diff);
  os << "max_rel_grad_diff=" << buf << "\n";
}

}  // namespace stateflow
