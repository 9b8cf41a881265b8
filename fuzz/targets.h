// What the fuzzers exercise, shared by the libFuzzer harness (harness.cpp) and the
// regression tests that replay the inputs the fuzzers found (tests/test_fuzz_regressions.cpp).
// Each takes arbitrary bytes and must either accept them or throw stateflow::Error: a crash,
// an out-of-bounds read, undefined behaviour or any other exception is a bug. Accepted
// inputs must also survive a round trip through the writer.
#pragma once
#include <cstddef>
#include <cstdint>

namespace stateflow::fuzz {

void safetensors(const uint8_t* data, size_t size);    // SafetensorsFile::parse
void model_config(const uint8_t* data, size_t size);   // ModelConfig::from_json of the bytes as JSON
void schedule_text(const uint8_t* data, size_t size);  // parse_schedule_text

}  // namespace stateflow::fuzz
