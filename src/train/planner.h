// The planner: prices pipeline configurations with the simulator on a measured cost model
// (train/cost_profile.h) and ranks them. It searches, for a model, P stages, a batch of B
// sequences of T tokens and a device memory limit: the schedule (stateflow and the 1f1b and
// gpipe baselines, which run whole sequences), microbatches M (divisors of B), --recompute,
// and for stateflow the chunk count N and the partition alpha (pipeline/chunk_partition.h).
// Every schedule gets the same search and the same memory limit. A configuration's
// prediction: the simulator's makespan for per-(stage, chunk) costs summed from the layer
// kinds' terms, and each stage's peak memory by category (weights, grads and optimizer state
// at the profiled bytes per parameter; each unit's stash at the profiled bytes per token, or
// under recomputation the layers' inputs; the K/V prefixes by their formula; each action's
// transient working memory, its largest layer's, as profiled). Messages between stages are
// not in the prediction unless PlanSpace::message_s says what one costs. Stages that share one
// GPU (PlanSpace::shared_device) run one action at a time and share its memory.
#pragma once
#include <iosfwd>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "model/config.h"
#include "pipeline/chunk_cost.h"
#include "pipeline/simulate.h"
#include "train/cost_profile.h"

namespace stateflow {

// Cut positions on multiples of this keep the GPU's chunked step bitwise equal to the unchunked
// one (kernels/cuda/weight_grad_cuda.h: kWeightGradTokens).
constexpr int64_t kBitwiseCutTokens = 2048;
// The default multiple for chunk cuts: kBitwiseCutTokens on a GPU, the mixers' largest inner
// block on the CPU.
int64_t default_chunk_multiple(const ModelConfig& m, Device device);

// What the search may choose from.
struct PlanSpace {
  ModelConfig model = model_preset("tiny");
  DType dtype = DType::F32;
  Device device = Device::CPU;
  int stages = 2;
  int64_t batch = 1, seq_len = 0;
  std::vector<std::string> schedules{"stateflow", "1f1b", "gpipe"};
  std::vector<int> microbatches;  // empty: every divisor of batch
  std::vector<int> chunks;        // stateflow's N; empty: 2, 4, 8, ... 64 that fit `multiple`
  std::vector<bool> recompute{false, true};
  std::vector<double> alphas;     // empty: partition_alphas()
  int64_t multiple = 1;           // cuts on multiples of this (chunk_partition.h)
  double memory_bytes = 0;        // per device; 0: no limit
  // Seconds every message between stages adds (latency, waking the receiver): not profiled (one
  // stage sends nothing); the chunk tuner fits it to a run's measured steps.
  double message_s = 0;
  // Every stage on one device (--transport local with --device cuda: stage threads on GPU 0):
  // their work is serialised and memory_bytes holds for all of them together.
  bool shared_device = false;
  // Every stage on one device, each on its own 1/P of its multiprocessors (--sm-split): their
  // work runs side by side, priced by a profile made on one such part (profile_options), and
  // memory_bytes holds for all of them together.
  bool split_sms = false;
};

struct Plan {
  std::string schedule = "stateflow";
  int microbatches = 1, chunks = 1;
  bool recompute = false;
  double alpha = 0;  // stateflow with N > 1; 0 otherwise
  std::vector<int64_t> chunk_lengths;
  // Predicted.
  double step_s = 0, tokens_per_s = 0, bubble = 0;
  std::vector<ByteCounts> stage_peak_bytes;  // by category (core/allocator.h)
  std::vector<int64_t> stage_peak_total;
  bool shared_device = false;  // PlanSpace::shared_device or split_sms: the stages' memory on one device
  bool fits = true;            // peak_total() within PlanSpace::memory_bytes
  // The peak of one device: the largest stage's, or the sum of the stages' when they share one
  // device (an upper bound: their peaks need not coincide).
  int64_t peak_total() const;
};

// Each stage's K/V prefixes of one microbatch of `rows` = sequences x seq_len tokens, and their
// gradients: the boundary-state tensors that grow with the chunks (model/mixer.h), in the
// state's GPU type on a GPU (gradients in fp32) and in the run's type on the CPU.
struct StagePrefixBytes {
  std::vector<int64_t> prefix, grad;
};
StagePrefixBytes kv_prefix_bytes(const ModelConfig& m, int stages, int64_t rows, Device device, DType dtype);

// The simulator's table for one configuration: stage costs (CostModel::stage_costs, or a
// tuned copy of them) at each chunk's length and prefix, and the memory described above.
CostTable plan_cost_table(const CostModel& c, const std::vector<PassCosts>& stages, const PlanSpace& space,
                          const Plan& p);
// Fills p's predicted fields from the simulator.
void predict_plan(const CostModel& c, const std::vector<PassCosts>& stages, const PlanSpace& space, Plan& p);

// The whole-model unit cost (every stage's forward + backward) that balanced partitions equalise.
CostTerms unit_cost(const std::vector<PassCosts>& stages, bool recompute);

// Every configuration of the space, predicted; ranked: those that fit by predicted tokens/s,
// then those that do not.
std::vector<Plan> search_plans(const CostModel& c, const PlanSpace& space);
// The same on given stage costs (e.g. tuned by measurements, chunk_tuner.h).
std::vector<Plan> search_plans(const CostModel& c, const std::vector<PassCosts>& stages, const PlanSpace& space);
// The best that fits of one schedule, or nullptr.
const Plan* best_plan(const std::vector<Plan>& ranked, const std::string& schedule);

// The longest sequence, a multiple of space.multiple up to `limit` tokens, for which some
// configuration of `schedule` in the space fits space.memory_bytes (which must be set); 0 when
// none does. Found by bisection: a longer sequence never needs less memory.
int64_t longest_fitting_seq_len(const CostModel& c, PlanSpace space, const std::string& schedule, int64_t limit);

// A ranked table (the first `top` rows, and the best of every schedule) with each stage's
// peak memory by category.
void print_plans(const std::vector<Plan>& ranked, const PlanSpace& space, int top, std::ostream& os);
// The options of `stateflow train` that run this plan.
std::string plan_arguments(const Plan& p);

// The plan file (`plan --auto --write-plan FILE`): the space's shape and the plan.
nlohmann::json plan_json(const Plan& p, const PlanSpace& space);
// The longest sequence a profile runs: it holds one sequence's activations of the whole model on
// one device; its fitted terms price longer sequences (attention's pairs are quadratic exactly).
constexpr int64_t kMaxProfileTokens = 32768;
// The profile that prices this space: its model, precision and device, units of its microbatch,
// sequences of its length up to kMaxProfileTokens.
ProfileOptions profile_options(const PlanSpace& space);

// `--chunks auto`: the cost model of this run's shape (cached, else profiled now) and the best
// plan of `space` (the caller fixes what the run fixes: schedule, M, recompute). Logs what it
// chose. Throws Error when nothing fits the memory limit. A recorded profile file (cost_profile,
// recorded_cost_model) prices the run instead of the cache or a new profile when given.
struct AutoChunks {
  CostModel costs;
  PlanSpace space;
  Plan plan;
};
AutoChunks choose_chunks(const PlanSpace& space, const std::string& profile_dir, std::ostream& log,
                         const std::string& cost_profile = "");

// Chunk lengths from a plan file, checked against the run's sequence length (0: unchecked).
std::vector<int64_t> chunk_lengths_from_plan_file(const std::string& path, int64_t seq_len);

}  // namespace stateflow
