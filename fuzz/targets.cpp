#include "targets.h"

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string_view>

#include "core/safetensors.h"
#include "model/config.h"
#include "pipeline/schedule.h"

namespace stateflow::fuzz {

// A broken invariant on an accepted input: stop here so the fuzzer records the input.
static void require(bool ok) {
  if (!ok) std::abort();
}

void safetensors(const uint8_t* data, size_t size) {
  try {
    SafetensorsFile f = SafetensorsFile::parse(std::vector<uint8_t>(data, data + size), "fuzz input");
    for (const StTensorInfo& t : f.tensors()) {
      // A copy reads every byte the tensor claims: out of bounds shows under ASan.
      const std::vector<uint8_t> copy(f.data(t), f.data(t) + (t.end - t.begin));
      require(copy.size() == t.end - t.begin && f.find(t.name) == &t);
    }
  } catch (const Error&) {
  }
}

void model_config(const uint8_t* data, size_t size) {
  const nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return;  // not JSON: load_model_config reports that before from_json
  try {
    const ModelConfig c = ModelConfig::from_json(j);
    require(ModelConfig::from_json(c.to_json()).to_json() == c.to_json());
    require(c.num_parameters() > 0);
  } catch (const Error&) {
  }
}

void schedule_text(const uint8_t* data, size_t size) {
  try {
    const Schedule s = parse_schedule_text(std::string_view(reinterpret_cast<const char*>(data), size));
    require(parse_schedule_text(to_text(s)) == s);
  } catch (const Error&) {
  }
}

}  // namespace stateflow::fuzz
