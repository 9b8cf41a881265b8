#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <ostream>

#include "pipeline/launch.h"
#include "train/checkpoint.h"
#include "pipeline/chunking.h"
#include "train/lr_schedule.h"
#include "train/stop_signal.h"

namespace stateflow {

std::string format_peak_memory(const MemorySnapshot& s) {
  std::string out;
  for (int c = 0; c < kNumMemCategories; ++c) {
    if (!s.peak[c]) continue;
    out += (out.empty() ? "" : ", ") + std::string(mem_category_name(MemCategory(c))) + " " + format_bytes(s.peak[c]);
  }
  return out + " | total " + format_bytes(s.total_peak);
}

Trainer::Trainer(const TrainOptions& opts) : opts_(opts) {
  opts_.validate();
  DataConfig dc = opts_.data;
  if (dc.kind == "recall" && dc.vocab_size == 0) dc.vocab_size = opts_.model.vocab_size;
  data_ = make_data_source(dc);
  SF_CHECK(data_->vocab_size() <= opts_.model.vocab_size, "the data uses ", data_->vocab_size(),
           " token ids but the model's vocab_size is ", opts_.model.vocab_size,
           ": raise vocab_size in the model config");
  if (!opts_.eval_data.kind.empty()) {
    DataConfig ec = opts_.eval_data;
    ec.vocab_size = dc.vocab_size;
    ec.recall = dc.recall;
    ec.seed = dc.seed + 1;  // recall: a stream the training batches never draw
    eval_data_ = make_data_source(ec);
    SF_CHECK(eval_data_->vocab_size() <= opts_.model.vocab_size, "the evaluation data uses ",
             eval_data_->vocab_size(), " token ids but the model's vocab_size is ", opts_.model.vocab_size,
             ": --eval-data must be tokenized like the training data");
    SF_CHECK(opts_.device == Device::CPU, "--eval-data runs on the CPU only for now: on the GPU, save checkpoints ",
             "(--save-dir, --save-every) and evaluate them with stateflow eval --device cuda --resume DIR");
  }
  pipeline_ = make_pipeline(opts_.pipeline_config(), opts_.transport);
  SF_CHECK(!eval_data_ || pipeline_->runs_all_stages(), "--eval-data needs every stage in this process (",
           "--transport local); with one process per stage, evaluate checkpoints with stateflow eval --resume DIR");
  if (!opts_.resume.empty()) load_checkpoint(opts_.resume);
}

void Trainer::enable_chunk_tuning(AutoChunks chosen, int rounds, double min_gain) {
  SF_CHECK(chosen.plan.chunk_lengths == pipeline_->config().chunk_lengths,
           "chunk tuning starts from the chunks the pipeline runs");
  tuner_ = std::make_unique<ChunkTuner>(std::move(chosen), rounds, min_gain);
}

EvalResult Trainer::evaluate_held_out() {
  SF_CHECK(eval_data_, "no held-out data: pass --eval-data KIND --eval-data-path FILE");
  std::vector<Layer*> layers;
  for (Stage* s : pipeline_->stages())
    for (Layer* l : s->model().layers()) layers.push_back(l);
  RecurrentForward model(layers, opts_.model.vocab_size);
  const std::vector<int64_t> chunks = opts_.resolved_chunk_lengths();
  eval_data_->set_position(0);  // the same held-out tokens every time
  return evaluate(model, *eval_data_, {opts_.eval_tokens, opts_.batch, opts_.seq_len,
                                       *std::max_element(chunks.begin(), chunks.end())});
}

std::string Trainer::save_checkpoint() {
  SF_CHECK(!opts_.save_dir.empty(), "saving a checkpoint needs --save-dir DIR");
  CheckpointState state{step_, skipped_, data_->position(), opts_.to_json()};
  std::string dir = stateflow::save_checkpoint(*pipeline_, opts_.save_dir, state, static_cast<int>(opts_.keep));
  last_saved_step_ = step_;
  return dir;
}

void Trainer::load_checkpoint(const std::string& path) {
  CheckpointState state = stateflow::load_checkpoint(*pipeline_, find_checkpoint(path));
  step_ = state.step;
  skipped_ = state.skipped_steps;
  data_->set_position(state.data_position);
  last_saved_step_ = step_;
}

StepReport Trainer::step() {
  auto t0 = std::chrono::steady_clock::now();
  Batch batch = data_->next(opts_.batch, opts_.seq_len);
  pipeline_->zero_grads();
  last_ = pipeline_->forward_backward(batch);
  StepReport r;
  r.step = step_;
  // A run shorter than the warmup warms up over the whole run.
  r.lr = LrSchedule{opts_.lr, opts_.min_lr, std::min(opts_.warmup, opts_.steps), opts_.steps}.at(step_);
  r.loss = last_.loss;
  r.grad_norm = pipeline_->grad_norm();
  if (std::isfinite(r.loss) && std::isfinite(r.grad_norm)) {
    pipeline_->clip_and_update(r.lr, r.grad_norm);
  } else {
    Pipeline::NonfiniteGrad where = pipeline_->locate_nonfinite_grad();
    r.warning = cat("step ", step_ + 1, ": the loss is ", r.loss, " and the gradient norm ", r.grad_norm);
    if (!where.param.empty())
      r.warning += cat("; the first non-finite gradient of the backward pass is in ", where.param, " (stage ",
                       where.stage, ")");
    else if (where.stage >= 0)
      r.warning += cat("; the first non-finite gradient of the backward pass is on stage ", where.stage);
    SF_CHECK(opts_.skip_nonfinite, r.warning,
             ". The weights were not updated: lower --lr, check the data, or pass --skip-nonfinite to skip such steps");
    r.skipped = true;
    ++skipped_;
  }
  r.accuracy = last_.stats.counted ? double(last_.stats.correct) / double(last_.stats.counted) : 0.0;
  r.tokens = batch.batch * batch.seq_len;
  r.bubble_fraction = last_.bubble_fraction;
  if (tuner_)
    if (auto d = tuner_->after_step(last_, pipeline_->config().chunk_lengths, *pipeline_)) {
      r.tuning = d->message;
      if (d->chunk_lengths) pipeline_->set_chunk_lengths(*d->chunk_lengths);
    }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ++step_;
  return r;
}

std::vector<StepReport> Trainer::run(std::ostream& log) {
  const bool report = is_reporting_rank(*pipeline_);
  const PipelineConfig pc = pipeline_->config();
  if (report) {
    log << "model " << opts_.model.name << ": " << opts_.model.num_parameters() << " parameters, vocab "
        << opts_.model.vocab_size << ", " << opts_.model.num_blocks() << " blocks (pattern " << opts_.model.pattern
        << "), d_model " << opts_.model.d_model << ", " << dtype_name(opts_.dtype)
        << " on " << device_name(opts_.device)
        << "\ndata: " << data_->describe()
        << (eval_data_ ? cat("\nheld-out data: ", eval_data_->describe(), "; ", opts_.eval_tokens, " tokens ",
                             opts_.eval_every ? cat("every ", opts_.eval_every, " steps and ") : std::string(),
                             "at the end")
                       : std::string())
        << "\nbatch " << opts_.batch << " x " << opts_.seq_len << " tokens; "
        << kind_name(pc.schedule) << " schedule over " << pc.stages << " stage(s) (" << opts_.transport
        << " transport), "
        << (pipeline_->replicas() > 1 ? cat(pipeline_->replicas(), " data-parallel replicas of ",
                                            opts_.batch / pipeline_->replicas(), " sequences, ")
                                      : std::string()) << pc.microbatches << " microbatch(es), chunks " << format_chunk_lengths(pc.chunk_lengths)
        << (pc.recompute ? ", full recomputation" : "") << "\n";
    if (!opts_.save_dir.empty())
      log << "checkpoints into " << opts_.save_dir << ": "
          << (opts_.save_every ? cat("every ", opts_.save_every, " steps, ") : std::string()) << "at the end and on "
          << "SIGINT/SIGTERM, keeping " << (opts_.keep ? cat("the newest ", opts_.keep) : std::string("all")) << "\n";
    if (step_ > 0) log << "resumed at step " << step_ << " of " << opts_.steps << "\n";
    log << std::flush;
  }
  auto save = [&] {
    std::string dir = save_checkpoint();
    if (report) log << "saved checkpoint " << dir << "\n" << std::flush;
  };
  std::ofstream metrics;
  if (report && !opts_.metrics_path.empty()) {
    // A resumed run appends to its file; a new or empty file (a fresh run, or a --metrics given
    // on resuming) starts with the header.
    namespace fs = std::filesystem;
    const bool fresh = step_ == 0 || !fs::exists(opts_.metrics_path) || fs::file_size(opts_.metrics_path) == 0;
    metrics.open(opts_.metrics_path, fresh ? std::ios::trunc : std::ios::app);
    SF_CHECK(metrics.good(), "cannot write --metrics file '", opts_.metrics_path, "'");
    if (fresh) metrics << "step,loss,accuracy,grad_norm,lr,seconds,bubble_fraction,eval_loss,eval_ppl,eval_accuracy\n";
    metrics.precision(17);
  }
  std::vector<StepReport> out;
  double window_tokens = 0, window_seconds = 0;
  while (step_ < opts_.steps) {
    // Every process must agree to stop at the same step boundary.
    if (int sig = static_cast<int>(pipeline_->max_over_processes(stop_signal()))) {
      stopped_by_ = sig;
      if (!opts_.save_dir.empty() && last_saved_step_ != step_) save();
      if (report)
        log << "stopped by " << signal_name(sig) << " after step " << step_ << " of " << opts_.steps << "; "
            << (opts_.save_dir.empty() ? std::string("nothing saved (no --save-dir)")
                                       : "continue with: stateflow train --resume " + opts_.save_dir)
            << "\n" << std::flush;
      return out;
    }
    out.push_back(step());
    StepReport& r = out.back();
    window_tokens += r.tokens, window_seconds += r.seconds;
    if (eval_data_ && ((opts_.eval_every && step_ % opts_.eval_every == 0) || step_ == opts_.steps)) {
      r.eval = evaluate_held_out();
      r.evaluated = true;
    }
    if (metrics.is_open()) {
      metrics << step_ << ',' << r.loss << ',' << r.accuracy << ',' << r.grad_norm << ',' << r.lr << ',' << r.seconds
              << ',' << r.bubble_fraction << ',';
      if (r.evaluated) metrics << r.eval.loss << ',' << r.eval.perplexity << ',' << r.eval.accuracy;
      else metrics << ",,";
      metrics << std::endl;
    }
    if (report && !r.tuning.empty()) log << "step " << step_ << ": " << r.tuning << "\n" << std::flush;
    if (report && r.skipped)
      log << "warning: skipped " << r.warning << " (" << skipped_ << " skipped so far)\n" << std::flush;
    if (report && (step_ % opts_.log_every == 0 || step_ == opts_.steps)) {
      char line[256];
      std::snprintf(line, sizeof line,
                    "step %5lld/%lld  loss %.4f  acc %.3f  |g| %.3f  lr %.2e  %.0f tok/s  bubble %.2f",
                    (long long)step_, (long long)opts_.steps, r.loss, r.accuracy, r.grad_norm, r.lr,
                    window_tokens / window_seconds, r.bubble_fraction);
      log << line << "\n";
      for (Stage* s : pipeline_->stages())
        log << "    stage " << s->rank() << " peak: " << format_peak_memory(s->tracker().snapshot()) << "\n";
      log << std::flush;
      window_tokens = window_seconds = 0;
    }
    if (report && r.evaluated)
      log << "eval  " << step_ << "/" << opts_.steps << "  " << format_eval(r.eval) << "\n" << std::flush;
    if (!opts_.save_dir.empty() && opts_.save_every > 0 && step_ % opts_.save_every == 0) save();
  }
  if (!opts_.save_dir.empty() && last_saved_step_ != step_) save();
  if (!opts_.trace_path.empty()) {
    std::vector<TimedAction> timeline;
    for (auto& s : last_.stages) timeline.insert(timeline.end(), s.timeline.begin(), s.timeline.end());
    write_chrome_trace(opts_.trace_path, trace_events(timeline, 1e6));
    if (report) log << "trace of the last step: " << opts_.trace_path << "\n";
  }
  return out;
}

}  // namespace stateflow
