#include "pipeline/layer_profile.h"

#include <chrono>


namespace stateflow {

const char* pass_name(Pass p) {
  return p == Pass::Forward ? "forward" : p == Pass::Recompute ? "recompute" : "backward";
}

LayerProfile::LayerProfile(Device device) {
  if (device != Device::CPU) clock_ = device_backend(device).make_clock();
}

void LayerProfile::time(int layer, const std::string& kind, Pass pass, const std::function<void()>& fn) {
  using Clock = std::chrono::steady_clock;
  double device_s = 0, host_s = 0;
  bool waited = false;
  if (clock_) {
    clock_->clear();
    clock_->hold();
    const int start = clock_->mark();
    const auto t0 = Clock::now();
    try {
      fn();
    } catch (...) {
      clock_->release();
      throw;
    }
    host_s = std::chrono::duration<double>(Clock::now() - t0).count();
    const int end = clock_->mark();
    clock_->release();
    device_s = clock_->seconds_between(start, end);
    waited = clock_->hold_timed_out();
  } else {
    const auto t0 = Clock::now();
    fn();
    device_s = host_s = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  LayerTiming* t = nullptr;
  for (LayerTiming& e : timings_)
    if (e.layer == layer && e.pass == pass) t = &e;
  if (!t) t = &timings_.emplace_back(LayerTiming{layer, kind, pass});
  ++t->calls, t->host_s += host_s, t->device_s += device_s, t->host_waits += waited;
}

}  // namespace stateflow
