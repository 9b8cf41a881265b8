#include "train/planner.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <nlohmann/json.hpp>
#include <ostream>

#include "core/error.h"
#include "model/mixer.h"
#include "model/model.h"
#include "pipeline/chunk_partition.h"
#include "pipeline/chunking.h"
#include "pipeline/partition.h"
#include "train/cost_profile.h"

namespace stateflow {

int64_t default_chunk_multiple(const ModelConfig& m, Device device) {
  return device == Device::CPU ? largest_inner_block(m) : kBitwiseCutTokens;
}

int64_t Plan::peak_total() const {
  if (shared_device) return std::accumulate(stage_peak_total.begin(), stage_peak_total.end(), int64_t(0));
  return stage_peak_total.empty() ? 0 : *std::max_element(stage_peak_total.begin(), stage_peak_total.end());
}

StagePrefixBytes kv_prefix_bytes(const ModelConfig& m, int P, int64_t rows, Device device, DType dtype) {
  const bool gpu = device != Device::CPU;
  StagePrefixBytes b;
  for (const std::string& blocks : stage_blocks(m, P)) {
    int64_t prefix = 0, grad = 0;
    for (char letter : blocks)
      for (const StateTensorSpec& t : mixer_for_letter(letter).boundary_state(m))
        if (t.grows_with_chunks) {
          prefix += rows * shape_numel(t.shape) * int64_t(dtype_size(gpu ? t.device_dtype : dtype));
          grad += rows * shape_numel(t.shape) * int64_t(dtype_size(gpu ? DType::F32 : dtype));
        }
    b.prefix.push_back(prefix), b.grad.push_back(grad);
  }
  return b;
}

CostTerms unit_cost(const std::vector<PassCosts>& stages, bool recompute) {
  CostTerms total;
  for (const PassCosts& s : stages) {
    total += s.forward, total += s.backward;
    if (recompute) total += s.forward;
  }
  return total;
}

CostTable plan_cost_table(const CostModel& c, const std::vector<PassCosts>& stages, const PlanSpace& space,
                          const Plan& p) {
  const int P = space.stages, N = int(p.chunk_lengths.size());
  SF_CHECK(int(stages.size()) == P, "planner: ", stages.size(), " stage costs for ", P, " stages");
  const double b = double(space.batch / p.microbatches);
  const std::vector<int64_t> params = stage_parameters(space.model, P);
  const auto ranges = stage_layer_ranges(space.model, P);
  CostTable t;
  t.forward_time.assign(P, std::vector<double>(N));
  t.backward_time.assign(P, std::vector<double>(N));
  t.unit_bytes.assign(P, std::vector<ByteCounts>(N, ByteCounts{}));
  t.resident_bytes.assign(P, ByteCounts{});
  t.forward_work_bytes.assign(P, std::vector<int64_t>(N));
  t.backward_work_bytes.assign(P, std::vector<int64_t>(N));
  t.shared_device = space.shared_device;
  for (int r = 0; r < P; ++r) {
    // Recomputation keeps each layer's input: hidden states, or the token ids on stage 0.
    const int layers = ranges[size_t(r)].second - ranges[size_t(r)].first;
    const double input_bytes_per_token = (r == 0 ? 4 + (layers - 1) * double(space.model.d_model) * c.input_bytes_per_value
                                                 : layers * double(space.model.d_model) * c.input_bytes_per_value);
    int64_t prefix = 0;
    for (int k = 0; k < N; ++k) {
      const double s = double(p.chunk_lengths[size_t(k)]), at = double(prefix);
      const PassCosts& st = stages[size_t(r)];
      t.forward_time[size_t(r)][size_t(k)] = st.forward.at(b, s, at);
      t.backward_time[size_t(r)][size_t(k)] = st.backward.at(b, s, at) + (p.recompute ? st.forward.at(b, s, at) : 0);
      t.unit_bytes[size_t(r)][size_t(k)][int(MemCategory::Activations)] =
          int64_t(b * s * (p.recompute ? input_bytes_per_token : st.stash_bytes_per_token));
      t.forward_work_bytes[size_t(r)][size_t(k)] = int64_t(st.forward_work_bytes(b, s, at));
      t.backward_work_bytes[size_t(r)][size_t(k)] = int64_t(st.backward_work_bytes(b, s, at, p.recompute));
      prefix += p.chunk_lengths[size_t(k)];
    }
    t.resident_bytes[size_t(r)][int(MemCategory::Weights)] = int64_t(double(params[size_t(r)]) * c.resident_bytes_per_parameter);
  }
  const StagePrefixBytes kv =
      kv_prefix_bytes(space.model, P, space.batch / p.microbatches * space.seq_len, space.device, space.dtype);
  t.kv_prefix_bytes = kv.prefix, t.kv_grad_bytes = kv.grad;
  if (space.message_s > 0) t.send_time.assign(size_t(N), space.message_s);
  return t;
}

void predict_plan(const CostModel& c, const std::vector<PassCosts>& stages, const PlanSpace& space, Plan& p) {
  p.chunks = int(p.chunk_lengths.size());
  const SimResult sim = simulate(make_schedule(p.schedule, space.stages, p.microbatches, p.chunks),
                                 plan_cost_table(c, stages, space, p));
  p.step_s = sim.makespan;
  p.tokens_per_s = sim.makespan > 0 ? double(space.batch * space.seq_len) / sim.makespan : 0;
  p.bubble = sim.bubble_fraction;
  p.stage_peak_bytes = sim.peak_bytes;
  p.stage_peak_total = sim.peak_total_bytes;
  p.shared_device = space.shared_device || space.split_sms;
  p.fits = space.memory_bytes <= 0 || double(p.peak_total()) <= space.memory_bytes;
}

std::vector<Plan> search_plans(const CostModel& c, const PlanSpace& space) {
  return search_plans(c, c.stage_costs(space.model, space.stages), space);
}

std::vector<Plan> search_plans(const CostModel& c, const std::vector<PassCosts>& stages, const PlanSpace& space) {
  SF_CHECK(space.seq_len >= 1 && space.batch >= 1, "planner: needs --batch and --seq-len");
  std::vector<int> Ms = space.microbatches;
  if (Ms.empty())
    for (int m = 1; m <= space.batch; ++m)
      if (space.batch % m == 0) Ms.push_back(m);
  std::vector<int> Ns = space.chunks;
  if (Ns.empty())
    for (int n = 2; n <= 64 && n * space.multiple <= space.seq_len; n *= 2) Ns.push_back(n);
  const std::vector<double>& alphas = space.alphas.empty() ? partition_alphas() : space.alphas;
  std::vector<Plan> out;
  for (const std::string& schedule : space.schedules) {
    const bool chunked = parse_schedule_kind(schedule) == ScheduleKind::StateFlow;
    for (int M : Ms) {
      SF_CHECK(M >= 1 && space.batch % M == 0, "planner: --microbatches ", M, " does not divide --batch ",
               space.batch);
      for (bool recompute : space.recompute) {
        const CostTerms balance = unit_cost(stages, recompute);
        const double b = double(space.batch / M);
        for (int N : chunked ? Ns : std::vector<int>{1}) {
          std::vector<std::vector<int64_t>> seen;
          for (double alpha : N > 1 ? alphas : std::vector<double>{0}) {
            Plan p;
            p.schedule = schedule, p.microbatches = M, p.chunks = N, p.recompute = recompute, p.alpha = alpha;
            p.chunk_lengths = N == 1 ? std::vector<int64_t>{space.seq_len}
                                     : alpha_partition(balance, b, space.seq_len, N, alpha, space.multiple);
            // An alpha with no partition, or one that rounds onto another's lengths, adds nothing.
            if (p.chunk_lengths.empty() || std::find(seen.begin(), seen.end(), p.chunk_lengths) != seen.end()) continue;
            seen.push_back(p.chunk_lengths);
            predict_plan(c, stages, space, p);
            out.push_back(std::move(p));
          }
        }
      }
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const Plan& x, const Plan& y) {
    return x.fits != y.fits ? x.fits : x.tokens_per_s > y.tokens_per_s;
  });
  return out;
}

const Plan* best_plan(const std::vector<Plan>& ranked, const std::string& schedule) {
  for (const Plan& p : ranked)
    if (p.fits && p.schedule == schedule) return &p;
  return nullptr;
}

int64_t longest_fitting_seq_len(const CostModel& c, PlanSpace space, const std::string& schedule, int64_t limit) {
  SF_CHECK(space.memory_bytes > 0, "the longest sequence that fits needs a memory limit (--memory-gib)");
  SF_CHECK(space.multiple >= 1 && limit >= space.multiple, "the longest sequence: the limit ", limit,
           " must be at least one multiple of ", space.multiple, " tokens");
  space.schedules = {schedule};
  const std::vector<PassCosts> stages = c.stage_costs(space.model, space.stages);
  auto fits = [&](int64_t k) {
    space.seq_len = k * space.multiple;
    return best_plan(search_plans(c, stages, space), schedule) != nullptr;
  };
  int64_t lo = 0, hi = limit / space.multiple + 1;  // fits(lo) or lo == 0; !fits(hi)
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo * space.multiple;
}

std::string plan_arguments(const Plan& p) {
  return cat("--schedule ", p.schedule, " --microbatches ", p.microbatches,
             p.chunks > 1 ? " --chunk-lengths " + format_chunk_lengths(p.chunk_lengths) : std::string(" --chunks 1"),
             p.recompute ? " --recompute full" : "");
}

void print_plans(const std::vector<Plan>& ranked, const PlanSpace& space, int top, std::ostream& os) {
  os << "PREDICTED by the simulator from the measured cost model: " << space.model.name << ", P=" << space.stages
     << ", batch " << space.batch << " x " << space.seq_len << ", cuts on multiples of " << space.multiple
     << ", memory limit "
     << (space.memory_bytes > 0 ? format_bytes(int64_t(space.memory_bytes)) : std::string("none")) << " per device"
     << (space.shared_device ? ", every stage on one device (one action at a time, memory summed over stages)" : "")
     << (space.split_sms ? ", every stage on its own 1/P of one device's SMs (side by side, memory summed over stages)"
                         : "")
     << "\n";
  char line[512];
  std::snprintf(line, sizeof line, "%4s %-10s %3s %4s %4s %6s %9s %11s %8s %12s  %s\n", "rank", "schedule", "M", "rec",
                "N", "alpha", "step s", "tokens/s", "bubble",
                space.shared_device || space.split_sms ? "peak/device" : "peak/stage",
                "chunk lengths");
  os << line;
  auto row = [&](size_t i) {
    const Plan& p = ranked[i];
    std::string lengths = format_chunk_lengths(p.chunk_lengths);
    if (lengths.size() > 60) lengths = lengths.substr(0, 57) + "...";
    std::snprintf(line, sizeof line, "%4zu %-10s %3d %4s %4d %6.2f %9.4f %11.0f %8.3f %12s  %s%s\n", i + 1,
                  p.schedule.c_str(), p.microbatches, p.recompute ? "full" : "-", p.chunks, p.alpha, p.step_s,
                  p.tokens_per_s, p.bubble, format_bytes(p.peak_total()).c_str(), lengths.c_str(),
                  p.fits ? "" : "  (over the memory limit)");
    os << line;
  };
  std::vector<size_t> shown;
  for (size_t i = 0; i < ranked.size() && int(i) < top; ++i) row(i), shown.push_back(i);
  for (const std::string& schedule : space.schedules)
    if (const Plan* best = best_plan(ranked, schedule)) {
      const size_t i = size_t(best - ranked.data());
      if (std::find(shown.begin(), shown.end(), i) == shown.end()) row(i), shown.push_back(i);
    }
  os << "peak memory per stage by category of the best plan of each schedule:\n";
  for (const std::string& schedule : space.schedules) {
    const Plan* best = best_plan(ranked, schedule);
    if (!best) {
      os << "  " << schedule << ": no configuration fits\n";
      continue;
    }
    for (size_t s = 0; s < best->stage_peak_bytes.size(); ++s) {
      os << "  " << schedule << " stage " << s << ":";
      for (int k = 0; k < kNumMemCategories; ++k)
        if (best->stage_peak_bytes[s][size_t(k)])
          os << " " << mem_category_name(MemCategory(k)) << " " << format_bytes(best->stage_peak_bytes[s][size_t(k)]);
      os << " | total " << format_bytes(best->stage_peak_total[s]) << "\n";
    }
  }
  const Plan* sf = best_plan(ranked, "stateflow");
  for (const std::string& schedule : space.schedules) {
    const Plan* base = best_plan(ranked, schedule);
    if (sf && base && base != sf)
      os << cat("best stateflow vs best ", schedule, " (each tuned over the same space): ",
                sf->tokens_per_s / base->tokens_per_s, "x tokens/s, ",
                double(sf->peak_total()) / double(base->peak_total()), "x peak memory\n");
  }
}

nlohmann::json plan_json(const Plan& p, const PlanSpace& space) {
  return {{"model", space.model.to_json()},
          {"stages", space.stages},
          {"batch", space.batch},
          {"seq_len", space.seq_len},
          {"device", device_name(space.device)},
          {"schedule", p.schedule},
          {"microbatches", p.microbatches},
          {"recompute", p.recompute},
          {"chunks", p.chunks},
          {"alpha", p.alpha},
          {"chunk_lengths", p.chunk_lengths},
          {"predicted_step_s", p.step_s},
          {"predicted_tokens_per_s", p.tokens_per_s},
          {"predicted_bubble", p.bubble},
          {"predicted_stage_peak_bytes", p.stage_peak_total},
          {"shared_device", p.shared_device},
          {"sm_split", space.split_sms},
          {"arguments", plan_arguments(p)}};
}

ProfileOptions profile_options(const PlanSpace& space) {
  stage_layer_ranges(space.model, space.stages);  // a model that cannot be cut so fails before the profile runs
  SF_CHECK(space.seq_len >= 1 && space.batch >= 1, "planner: needs --batch and --seq-len of at least 1");
  ProfileOptions po;
  po.model = space.model, po.dtype = space.dtype, po.device = space.device;
  // The whole model's stash of one sequence must fit on the one device; the terms price longer ones.
  po.seq_len = std::min(space.seq_len, kMaxProfileTokens);
  // Units of the run's microbatch when it is fixed (the fixed term is per unit), else of one sequence.
  po.batch = space.microbatches.size() == 1 ? space.batch / space.microbatches.front() : 1;
  po.multiple = std::min<int64_t>(space.multiple, std::max<int64_t>(1, space.seq_len / 32));
  // A stage of an SM split runs on 1/P of the SMs: so does its profile.
  po.sm_parts = space.split_sms ? space.stages : 1;
  return po;
}

AutoChunks choose_chunks(const PlanSpace& space, const std::string& profile_dir, std::ostream& log,
                         const std::string& cost_profile) {
  const ProfileOptions po = profile_options(space);
  AutoChunks a{cost_profile.empty() ? cached_cost_model(po, profile_dir, log) : recorded_cost_model(cost_profile, po, log),
               space, {}};
  const std::vector<Plan> ranked = search_plans(a.costs, space);
  SF_CHECK(!ranked.empty() && ranked.front().fits, "--chunks auto: no chunking of ", space.seq_len,
           " tokens fits the memory limit of ", format_bytes(int64_t(space.memory_bytes)),
           " per device: use more microbatches, --recompute full, or a shorter --seq-len");
  a.plan = ranked.front();
  log << cat("--chunks auto: N ", a.plan.chunks, ", alpha ", a.plan.alpha, ", chunks ",
             format_chunk_lengths(a.plan.chunk_lengths), " (predicted ", a.plan.step_s, " s per step, bubble ",
             a.plan.bubble, ")\n")
      << std::flush;
  return a;
}

std::vector<int64_t> chunk_lengths_from_plan_file(const std::string& path, int64_t seq_len) {
  std::ifstream in(path);
  SF_CHECK(in.good(), "cannot read the plan file '", path, "'");
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  SF_CHECK(!j.is_discarded() && j.is_object() && j.contains("chunk_lengths") && j["chunk_lengths"].is_array(),
           "'", path, "' is not a plan file (write one with stateflow plan --auto --write-plan FILE)");
  std::vector<int64_t> lengths;
  for (const nlohmann::json& x : j["chunk_lengths"]) {
    SF_CHECK(x.is_number_integer(), "plan file '", path, "': chunk_lengths must be whole numbers");
    lengths.push_back(x.get<int64_t>());
  }
  SF_CHECK(seq_len == 0 || j.value("seq_len", seq_len) == seq_len, "plan file '", path, "' was made for --seq-len ",
           j.value("seq_len", int64_t(0)), " but this run has --seq-len ", seq_len,
           ": plan again with --seq-len ", seq_len);
  if (seq_len) validate_chunk_lengths(lengths, seq_len);
  return lengths;
}

}  // namespace stateflow
