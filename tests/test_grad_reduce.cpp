// Gradient buckets for data parallelism: every parameter in exactly one bucket, in backward
// order; a bucket starts as soon as its lowest layer's last backward is done, while the stage's
// last backward still runs (overlap), and the sums land in the gradients.
#include "pipeline/grad_reduce.h"

#include <gtest/gtest.h>

#include <set>

#include "layer_testing.h"
#include "pipeline/local_transport.h"
#include "pipeline/stage.h"
#include "test_util.h"

using namespace stateflow;
using namespace stateflow::testing;

namespace {

// A stage group of `replicas` ranks whose other replicas hold the same gradients as this one:
// the sum is the gradient times `replicas`. Records what it was asked to sum (not the tensors:
// they belong to the stage, which may go first).
class MirroredGroup : public Transport {
 public:
  explicit MirroredGroup(int replicas) : replicas_(replicas) {}
  int rank() const override { return 0; }
  int world_size() const override { return replicas_; }
  std::string name() const override { return "mirrored"; }
  void send(int, const MessageTag&, const Tensor&) override { fail("no sends in a stage group"); }
  Tensor recv(int, const MessageTag&, const MessageSpec&) override { fail("no receives in a stage group"); }
  double all_reduce_sum(double v) override { return v * replicas_; }
  double all_reduce_max(double v) override { return v; }
  void flush() override {}
  void abort(const std::string&) override {}
  void start_all_reduce_sum(const std::vector<Tensor>& tensors, const std::string& what) override {
    starts.push_back({what, tensors.size(), in_flight ? in_flight() : 0});
    for (const Tensor& t : tensors) pending.push_back(t);
  }
  void wait_all_reduces() override {
    for (Tensor& t : pending) scale(t);
    pending.clear();
    ++waits;
  }
  struct Start {
    std::string what;
    size_t tensors;
    size_t units_in_flight;  // of the stage's executor when the bucket started
  };
  std::vector<Start> starts;
  int waits = 0;
  std::function<size_t()> in_flight;

 private:
  void scale(Tensor& t) {
    double* p = t.data<double>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] *= replicas_;
  }
  int replicas_;
  std::vector<Tensor> pending;
};

Param param(const std::string& name, int64_t n) { return make_param(name, {n}, DType::F64); }

}  // namespace

TEST(GradBuckets, EveryParameterOnceInBackwardOrderSplitBySize) {
  Param a = param("a", 10), b = param("b", 20), c = param("c", 5), d = param("d", 40), e = param("e", 3);
  // Layer 1 shares a with layer 0: a belongs to layer 0, whose backward comes last.
  const std::vector<std::vector<Param*>> layers = {{&a, &b}, {&c, &a}, {&d, &e}};
  const std::vector<GradBucket> buckets = plan_buckets(layers, 8 * 30);  // 30 doubles
  std::vector<std::vector<std::string>> names;
  for (const GradBucket& k : buckets) {
    names.emplace_back();
    for (Param* p : k.params) names.back().push_back(p->name);
  }
  // Backward order: layer 2 (e, d), layer 1 (c), layer 0 (b, a); a bucket closes once it
  // holds >= 240 bytes: e + d = 344 bytes, then c + b = 200 takes a too.
  const std::vector<std::vector<std::string>> want = {{"e", "d"}, {"c", "b", "a"}};
  ASSERT_EQ(names, want);
  EXPECT_EQ(buckets[0].lowest_layer, 2);
  EXPECT_EQ(buckets[1].lowest_layer, 0);
  EXPECT_EQ(buckets[0].bytes, 8 * 43);
  EXPECT_EQ(plan_buckets(layers, 1).size(), 5u) << "one parameter per bucket";
  expect_error([&] { plan_buckets(layers, 0); }, "bucket size must be positive");
}

TEST(GradBuckets, ABucketStartsOnceItsLowestLayerIsDone) {
  Param a = param("a", 4), b = param("b", 4), c = param("c", 4);
  MirroredGroup group(3);
  GradientReducer reducer({{&a}, {&b}, {&c}}, group, 0, 1);  // one parameter per bucket
  reducer.layer_done(2);
  ASSERT_EQ(group.starts.size(), 1u);
  EXPECT_NE(group.starts[0].what.find("gradient bucket 1 of 3 of stage 0 (c..c)"), std::string::npos);
  reducer.layer_done(1);
  EXPECT_EQ(group.starts.size(), 2u);
  a.grad.data<double>()[0] = 1.5;
  reducer.finish();  // starts layer 0's bucket, then waits
  EXPECT_EQ(group.starts.size(), 3u);
  EXPECT_EQ(group.waits, 1);
  EXPECT_EQ(a.grad.data<double>()[0], 4.5) << "the sum over the 3 mirrored replicas";
  reducer.finish();  // a step without reported layers still sums everything, in the same order
  ASSERT_EQ(group.starts.size(), 6u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(group.starts[i].what, group.starts[i + 3].what);
}

// Through a stage: every bucket starts inside the step's last backward (the unit is still in
// flight), and the gradients that come out are the replicas' sum.
TEST(GradBuckets, AStageStartsItsBucketsDuringItsLastBackward) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  PipelineConfig pc;
  pc.model = model_preset("tiny");
  pc.dtype = DType::F64;
  pc.microbatches = 2;
  pc.chunk_lengths = {5, 8, 4};
  pc.bucket_bytes = 2048;
  const Batch batch = random_batch(rng, 4, 17, pc.model.vocab_size);
  auto plain = make_local_transports(1, 5);
  Stage reference(pc, 0, *plain[0]);
  reference.forward_backward(batch);

  auto ends = make_local_transports(1, 5);
  MirroredGroup group(2);
  Stage stage(pc, 0, *ends[0], &group);
  group.in_flight = [&] { return stage.executor().units_in_flight(); };
  stage.forward_backward(batch);
  ASSERT_GT(stage.reducer()->buckets().size(), 2u) << "the test wants several buckets";
  ASSERT_EQ(group.starts.size(), stage.reducer()->buckets().size());
  for (const auto& s : group.starts) EXPECT_EQ(s.units_in_flight, 1u) << s.what << " started outside the backward";
  EXPECT_EQ(group.waits, 1);
  std::set<Param*> summed;
  for (const GradBucket& k : stage.reducer()->buckets()) summed.insert(k.params.begin(), k.params.end());
  EXPECT_EQ(summed.size(), stage.model().params().size());
  const std::vector<Param*> want = reference.model().params(), got = stage.model().params();
  for (size_t i = 0; i < want.size(); ++i) {
    Tensor twice = want[i]->grad.clone();
    twice.add_(want[i]->grad);
    EXPECT_EQ(max_rel_diff(got[i]->grad, twice), 0.0) << got[i]->name;
  }
}
