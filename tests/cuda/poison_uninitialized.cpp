// Every CUDA test runs with Tensor::uninitialized device tensors filled with NaN bytes: a
// layer that takes an output it does not write entirely gets NaN in its results, which the
// tests against the CPU model and the bitwise chunking tests catch.
#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "kernels/cuda/cuda_backend.h"

namespace stateflow {
namespace {

class PoisonUninitialized : public ::testing::Environment {
 public:
  void SetUp() override {
    if (testing::gpu_missing().empty()) poison_uninitialized_device_tensors(true);
  }
};

[[maybe_unused]] ::testing::Environment* const kPoison =
    ::testing::AddGlobalTestEnvironment(new PoisonUninitialized);

}  // namespace
}  // namespace stateflow
