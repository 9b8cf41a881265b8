// Every registered op (kernels/op_def.h) on the GPU: for each activation type and test shape,
// inputs drawn on the host, every pass launched in order on poisoned outputs and compared,
// array by array, with its float64 reference under the array's tolerance; then the whole op
// again on fresh buffers gives every written array bitwise; no launch writes past the op's
// workspace. A new op gets this by registering.
// Also: the device draw (what the benchmarks time on) gives the host draw's values.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cuda/op_buffers.h"
#include "kernels/op_def.h"
#include "test_util.h"

namespace stateflow {
namespace {

using namespace testing;

std::vector<std::string> op_names() {
  std::vector<std::string> names;
  for (const OpDef& op : all_ops()) names.push_back(op.name);
  return names;
}

class OpDefCuda : public ::testing::TestWithParam<std::string> {};

TEST_P(OpDefCuda, EveryPassMatchesItsReferenceAndRepeatsBitwise) {
  SKIP_WITHOUT_GPU();
  const OpDef& op = op_named(GetParam());
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (DType act : op.acts)
    for (const OpShape& shape : op.test_shapes) {
      SCOPED_TRACE(std::string(dtype_name(act)) + " activations, " + shape.label());
      OpHost ref = draw_inputs(op, shape, act, seed);
      OpBuffers dev(op, shape, act);
      dev.upload(ref);
      dev.poison_outputs();
      std::vector<std::string> written;
      for (const OpPass& pass : op.passes) {
        dev.run(pass);
        pass.reference(shape, act, ref);
        sync_ok();
        const OpHost got = dev.download();
        for (const std::string& name : pass.writes) {
          const double err = rel_err(got.at(name), ref.at(name)), tol = op.array(shape, name).tolerance.at(act);
          std::printf("  %-10s %-9s %-6s rel err %.3e (bound %.1e)\n", op.name.c_str(), pass.name.c_str(),
                      name.c_str(), err, tol);
          EXPECT_FALSE(has_nan(got.at(name))) << pass.name << " " << name << ": NaN (unwritten element?)";
          EXPECT_LE(err, tol) << pass.name << " " << name;
          written.push_back(name);
        }
      }
      EXPECT_FALSE(dev.workspace_overrun()) << "a pass wrote past the op's workspace_bytes";
      OpBuffers again(op, shape, act);
      again.upload(draw_inputs(op, shape, act, seed));
      again.run_all();
      sync_ok();
      for (const std::string& name : written) EXPECT_TRUE(again.raw(name) == dev.raw(name)) << name << " not repeatable";
    }
}

TEST_P(OpDefCuda, DeviceDrawGivesTheHostDraw) {
  SKIP_WITHOUT_GPU();
  const OpDef& op = op_named(GetParam());
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const DType act = op.acts.back();
  const OpShape& shape = op.test_shapes.front();
  const OpHost host = draw_inputs(op, shape, act, seed);
  OpBuffers dev(op, shape, act);
  dev.draw(seed);
  sync_ok();
  const OpHost got = dev.download();
  for (const OpArray& a : op.arrays(shape)) {
    if (a.role == Role::Out) continue;
    // Host and device double math (log, cos) may differ in a double's last bit, which can move
    // a rounding to f32 or bf16 by one unit in the last place: allow that, nothing more.
    const DType stored = array_dtype(a.type, act);
    const double ulp = stored == DType::BF16 ? 0x1p-7 : stored == DType::F32 ? 0x1p-23 : 0.0;
    int64_t differing = 0;
    for (size_t i = 0; i < host.at(a.name).size(); ++i) {
      const double h = host.at(a.name)[i], d = got.at(a.name)[i];
      differing += h != d;
      ASSERT_LE(std::abs(h - d), ulp * std::abs(h)) << a.name << "[" << i << "]: host " << h << ", device " << d;
    }
    if (differing) std::printf("  %s %s: %lld elements one ulp apart\n", op.name.c_str(), a.name.c_str(), (long long)differing);
  }
}

INSTANTIATE_TEST_SUITE_P(AllOps, OpDefCuda, ::testing::ValuesIn(op_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace stateflow
