// Replays through the fuzz targets (fuzz/targets.h) every input the fuzzers found a bug with
// (tests/fuzz_regressions/<target>/) and the seed corpora (fuzz/corpus/<target>/): each must
// be accepted or refused with stateflow::Error, without crashing. The bugs found are also
// pinned down by name below.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "../fuzz/targets.h"
#include "core/file_io.h"
#include "model/config.h"
#include "test_util.h"

using namespace stateflow;
using namespace stateflow::testing;
namespace fs = std::filesystem;

namespace {

// Runs `target` on every file under each directory; returns how many it ran.
int replay(void (*target)(const uint8_t*, size_t), const std::string& name) {
  int n = 0;
  for (const char* root : {"tests/fuzz_regressions", "fuzz/corpus"}) {
    const fs::path dir = fs::path(STATEFLOW_SOURCE_DIR) / root / name;
    if (!fs::is_directory(dir)) continue;
    for (const auto& e : fs::directory_iterator(dir)) {
      SCOPED_TRACE(e.path().string());
      std::vector<uint8_t> bytes = read_file_bytes(e.path().string(), "fuzz input");
      target(bytes.data(), bytes.size());
      ++n;
    }
  }
  return n;
}

}  // namespace

TEST(FuzzRegressions, SafetensorsInputs) { EXPECT_GT(replay(fuzz::safetensors, "safetensors"), 0); }
TEST(FuzzRegressions, ModelConfigInputs) { EXPECT_GT(replay(fuzz::model_config, "model_config"), 0); }
TEST(FuzzRegressions, ScheduleTextInputs) { EXPECT_GT(replay(fuzz::schedule_text, "schedule_text"), 0); }

// Found by fuzz_model_config: a non-string preset escaped as a JSON library exception.
TEST(FuzzRegressions, ModelConfigPresetMustBeAString) {
  expect_error([] { ModelConfig::from_json(nlohmann::json::parse(R"({"preset": 3})")); },
               "field 'preset' must be a preset name (a string)");
}

// Found by fuzz_model_config under UBSan: a float too large for an integer field was cast
// (undefined behaviour); a float of any size is now the wrong type.
TEST(FuzzRegressions, ModelConfigIntegerFieldsRefuseFloats) {
  for (const char* text : {R"({"d_model": 1e300})", R"({"gdn": {"heads": 2.5}})", R"({"seed": -1})"})
    expect_error([&] { ModelConfig::from_json(nlohmann::json::parse(text)); }, "has the wrong type: expected");
}
