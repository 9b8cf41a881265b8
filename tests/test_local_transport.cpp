// The local transport hands over a copy of what was sent when it matches the receiver's
// MessageSpec, and fails naming the message, the peer and both descriptions when it does not.
#include "pipeline/local_transport.h"

#include <gtest/gtest.h>

#include <thread>

#include "core/rng.h"
#include "test_util.h"

using namespace stateflow;
using namespace stateflow::testing;

namespace {

Tensor random_tensor(Rng& rng, const Shape& shape) {
  Tensor t = Tensor::zeros(shape, DType::F32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float(rng.normal());
  return t;
}

}  // namespace

TEST(LocalTransport, MatchingSpecDeliversACopy) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  auto ends = make_local_transports(2, 5);
  const Shape shape{1 + int64_t(rng.below(7)), 1 + int64_t(rng.below(9))};
  Tensor sent = random_tensor(rng, shape);
  const MessageTag tag{Payload::Activation, 1, 2};
  ends[0]->begin_batch();  // batches are no-ops here
  ends[0]->send(1, tag, sent);
  ends[0]->end_batch();
  Tensor got = ends[1]->recv(0, tag, {shape, DType::F32, Device::CPU});
  EXPECT_NE(got.raw(), sent.raw()) << "the receiver owns its copy";
  EXPECT_EQ(max_rel_diff(got, sent), 0.0);
}

TEST(LocalTransport, MismatchingSpecFailsNamingBoth) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  auto ends = make_local_transports(2, 5);
  const MessageTag tag{Payload::Gradient, 0, 3};
  const Shape shape{4, 6};
  ends[1]->send(0, tag, random_tensor(rng, shape));
  expect_error([&] { ends[0]->recv(1, tag, {{6, 4}, DType::F32, Device::CPU}); },
               "the gradient of B(0,3) from stage 1 arrived as f32 [4, 6] on cpu but the receiver expects f32 [6, 4]");
  ends[1]->send(0, tag, random_tensor(rng, shape));
  expect_error([&] { ends[0]->recv(1, tag, {shape, DType::F64, Device::CPU}); }, "expects f64");
}
