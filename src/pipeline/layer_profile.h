// Where a unit's time goes, layer by layer: how long the host takes to issue each layer's
// forward or backward (kernel launches, cuBLAS calls, allocations) against how long the
// device takes to run that work. On a GPU the clock holds the device's queue while the host
// issues a layer and releases it afterwards, so the device time is the work's alone, run back
// to back; a host that issues more slowly than the device works starves the GPU by the
// difference. On the CPU the work is done when the call returns: the device time is the
// host time. Profiling synchronises after every layer: use it for a breakdown, not for timing
// a step. On a GPU it also times the named parts of each layer call (core/op_scope.h), so the
// breakdown goes down to the GEMMs and kernels.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/op_scope.h"

namespace stateflow {

// Recompute: a forward run again inside backward (--recompute full).
enum class Pass { Forward, Recompute, Backward };
const char* pass_name(Pass p);

struct LayerTiming {
  int layer = 0;     // index in the whole model
  std::string kind;  // Layer::kind()
  Pass pass = Pass::Forward;
  int calls = 0;         // units timed
  double host_s = 0;     // summed over the calls
  double device_s = 0;
  // Calls whose host waited for the device while issuing (a synchronising call inside: the
  // hold ran out). Their host time includes the hold's second.
  int host_waits = 0;
};

// One named part (OpScope) of one pass, summed over every layer call that ran it. A layer
// kind's "<kind>.(rest)" entry is its calls' device time outside any outermost part: work no
// part names, and the device's gaps between one kernel and the next where they fall between
// parts (a gap inside a part counts in that part). Where every kernel is inside some part, as in
// the GPU blocks, the rest is these gaps alone, about the same per boundary.
struct OpTiming {
  std::string name;
  Pass pass = Pass::Forward;
  int calls = 0;
  double device_s = 0;
  // "(rest)" entries: the calls' part boundaries (outermost parts + 1 a call), summed.
  int boundaries = 0;
};

class LayerProfile final : public OpTimer {
 public:
  // device: where the stage's layers run (a GPU profile keeps a clock of its own).
  explicit LayerProfile(Device device);
  // With the given clock (tests: a clock of their own); nullptr times on the host as on the CPU.
  explicit LayerProfile(std::unique_ptr<DeviceClock> clock) : clock_(std::move(clock)) {}
  // Runs fn, one layer's forward or backward of one unit, and adds its times to that layer's.
  void time(int layer, const std::string& kind, Pass pass, const std::function<void()>& fn);
  // One entry per (layer, pass) timed, in order of first call.
  const std::vector<LayerTiming>& timings() const { return timings_; }
  // The device time of the last call of time() (the cost profile reads each call on its own).
  double last_device_s() const { return last_device_s_; }
  // Per (part, pass), in order of first call; empty on the CPU.
  const std::vector<OpTiming>& op_timings() const { return op_timings_; }

  void begin(const char* name) override;
  void end() override;

 private:
  struct Part {
    const char* name;
    int start, end, depth;
  };
  void add_op(const std::string& name, Pass pass, double device_s, int boundaries = 0);

  std::unique_ptr<DeviceClock> clock_;  // nullptr on the CPU
  std::vector<LayerTiming> timings_;
  std::vector<OpTiming> op_timings_;
  std::vector<Part> parts_;  // of the layer call in progress
  std::vector<size_t> open_;  // indices into parts_ of the parts begun and not ended
  double last_device_s_ = 0;
};

}  // namespace stateflow
