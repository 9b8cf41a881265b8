// The libFuzzer entry point; CMake builds this file once per target in targets.h, naming it
// with STATEFLOW_FUZZ_TARGET (e.g. -DSTATEFLOW_FUZZ_TARGET=safetensors).
#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  stateflow::fuzz::STATEFLOW_FUZZ_TARGET(data, size);
  return 0;
}
