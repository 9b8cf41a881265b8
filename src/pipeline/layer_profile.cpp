#include "pipeline/layer_profile.h"

#include <chrono>

#include "core/error.h"

namespace stateflow {

const char* pass_name(Pass p) {
  return p == Pass::Forward ? "forward" : p == Pass::Recompute ? "recompute" : "backward";
}

LayerProfile::LayerProfile(Device device) {
  if (device != Device::CPU) clock_ = device_backend(device).make_clock();
}

void LayerProfile::begin(const char* name) {
  open_.push_back(parts_.size());
  parts_.push_back(Part{name, clock_->mark(), -1, int(open_.size()) - 1});
}

void LayerProfile::end() {
  SF_CHECK(!open_.empty(), "layer profile: a part ended that was not begun");
  parts_[open_.back()].end = clock_->mark();
  open_.pop_back();
}

void LayerProfile::add_op(const std::string& name, Pass pass, double device_s, int boundaries) {
  OpTiming* t = nullptr;
  for (OpTiming& e : op_timings_)
    if (e.name == name && e.pass == pass) t = &e;
  if (!t) t = &op_timings_.emplace_back(OpTiming{name, pass});
  ++t->calls, t->device_s += device_s, t->boundaries += boundaries;
}

void LayerProfile::time(int layer, const std::string& kind, Pass pass, const std::function<void()>& fn) {
  using Clock = std::chrono::steady_clock;
  double device_s = 0, host_s = 0;
  bool waited = false;
  if (clock_) {
    clock_->clear();
    parts_.clear(), open_.clear();
    clock_->hold();
    const int start = clock_->mark();
    const auto t0 = Clock::now();
    OpTimer* outer = thread_op_timer();
    thread_op_timer() = this;
    try {
      fn();
    } catch (...) {
      thread_op_timer() = outer;
      clock_->release();
      throw;
    }
    thread_op_timer() = outer;
    host_s = std::chrono::duration<double>(Clock::now() - t0).count();
    const int end = clock_->mark();
    clock_->release();
    device_s = clock_->seconds_between(start, end);
    waited = clock_->hold_timed_out();
    double in_parts = 0;
    int outermost = 0;
    for (const Part& p : parts_) {
      const double s = clock_->seconds_between(p.start, p.end);
      add_op(p.name, pass, s);
      if (p.depth == 0) in_parts += s, ++outermost;
    }
    if (!parts_.empty()) add_op(kind + ".(rest)", pass, device_s - in_parts, outermost + 1);
  } else {
    const auto t0 = Clock::now();
    fn();
    device_s = host_s = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  last_device_s_ = device_s;
  LayerTiming* t = nullptr;
  for (LayerTiming& e : timings_)
    if (e.layer == layer && e.pass == pass) t = &e;
  if (!t) t = &timings_.emplace_back(LayerTiming{layer, kind, pass});
  ++t->calls, t->host_s += host_s, t->device_s += device_s, t->host_waits += waited;
}

}  // namespace stateflow
