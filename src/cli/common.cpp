#include "cli/common.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/mixer.h"
#include "pipeline/launch.h"
#include "pipeline/rank_env.h"
#include "pipeline/chunking.h"
#include "model/device_ops.h"

namespace stateflow::cli {

void ModelOptions::add(CLI::App& app, const std::string& default_preset, const std::string& default_dtype) {
  preset = default_preset;
  dtype = default_dtype;
  std::string names;
  for (auto& n : model_preset_names()) names += (names.empty() ? "" : ", ") + n;
  app.add_option("--preset", preset, "Model preset: " + names)->capture_default_str();
  app.add_option("--config", config_path,
                 "Model config JSON file (a full config, or {\"preset\": ..., overrides}); wins over --preset");
  app.add_option("--pattern", pattern,
                 "Layer pattern: one letter per block, '|' between pipeline stages (e.g. GGGA|GGGA); replaces the "
                 "preset's or config's. Letters: " + mixer_letters_help());
  app.add_option("--dtype", dtype, "Precision of weights and arithmetic: f32 or f64")->capture_default_str();
  app.add_option("--device", device,
                 "Where the model runs: cpu, or cuda (GPU 0 for every stage; f32 master weights, bf16 activations)")
      ->capture_default_str();
}

Device ModelOptions::resolve_device() const {
  const Device d = parse_device(device);
  init_device(d);
  return d;
}

ModelConfig ModelOptions::resolve() const {
  return resolve_model_config(preset, config_path, pattern);
}

bool ModelOptions::vocab_fixed() const {
  if (config_path.empty()) return false;
  std::ifstream in(config_path);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);  // resolve() reports bad files
  return j.is_object() && j.contains("vocab_size");
}

void PipelineOptions::add(CLI::App& app, bool with_chunks) {
  app.add_option("--stages", stages, "Pipeline stages P (at most the model's number of blocks)")->capture_default_str();
  app.add_option("--microbatches", microbatches, "Microbatches M per step (must divide --batch)")
      ->capture_default_str();
  if (with_chunks) {
    // A given value is never replaced by a default: bad ones are refused here.
    app.add_option_function<std::string>(
           "--chunks",
           [this](const std::string& v) {
             chunks_auto = v == "auto";
             if (!chunks_auto) chunks = std::stoll(v);
           },
           "Chunks N per sequence (nearly equal lengths), or auto: the planner chooses N and uneven lengths from "
           "costs measured on this device (a short profile, cached) and, in train, tunes them online")
        ->default_str(std::to_string(chunks))
        ->check([](const std::string& v) {
          return v == "auto" || (v.find_first_not_of("0123456789") == std::string::npos &&
                                 v.find_first_not_of('0') != std::string::npos)
                     ? std::string()
                     : v + " is not a number of chunks: give a whole number, at least 1, or auto";
        });
    app.add_option("--chunk-lengths", chunk_lengths,
                   "Explicit chunk lengths a,b,c,... summing to --seq-len, or a plan file of stateflow plan --auto "
                   "--write-plan")
        ->check([](const std::string& v) {
          return v.empty() ? std::string("it is empty: give lengths a,b,c,... summing to --seq-len, or leave it out")
                           : std::string();
        });
    app.add_option("--chunk-multiple", chunk_multiple,
                   "With --chunks auto: cut on multiples of this many tokens (default: 2048 on cuda, which keeps the "
                   "GPU step bitwise equal to the unchunked one; the mixers' inner block on the cpu; 1: exact)");
    app.add_option("--cost-profile", cost_profile,
                   "With --chunks auto: plan on this recorded cost profile (a file of --profile-dir, e.g. from an "
                   "earlier run on the same kind of GPU) instead of the cache or a new profile; its model, device and "
                   "--sm-split must be this run's");
    app.add_option("--profile-dir", profile_dir,
                   "With --chunks auto: where measured cost profiles are cached (default: " + default_profile_dir() +
                       ")");
  }
  app.add_option("--schedule", schedule, "Pipeline schedule: stateflow (chunk-level 1F1B), 1f1b, gpipe")
      ->capture_default_str();
  app.add_option("--transport", transport,
                 "Between stages: auto (nccl for --device cuda when there is a GPU per stage, else local), local "
                 "(threads in this process; with cuda every stage on GPU 0), mpi (CPU, one process per stage, "
                 "mpirun -n P) or nccl (GPUs: stage i on GPU i in this process, or one process per GPU when "
                 "--rank or a launcher's variables give one)")
      ->capture_default_str();
  app.add_option("--rank", rank,
                 "NCCL, one process per GPU: this process's rank (default: torchrun's RANK, then Open MPI's "
                 "OMPI_COMM_WORLD_RANK, then Slurm's SLURM_PROCID)");
  app.add_option("--world-size", world_size, "NCCL, one process per GPU: number of processes (= --stages)");
  app.add_option("--local-rank", local_rank, "NCCL, one process per GPU: this process's GPU (default: --rank)");
  app.add_option("--rendezvous", rendezvous,
                 "NCCL without mpirun: HOST:PORT where rank 0 hands out the NCCL id (default MASTER_ADDR:MASTER_PORT "
                 "when set, else 127.0.0.1:29500)");
  app.add_option("--timeout", timeout_s, "Seconds to wait for a peer stage before failing the run")
      ->capture_default_str();
  app.add_option("--recompute", recompute,
                 "Activation recomputation: none, or full (keep each layer's input, redo its forward in backward)")
      ->capture_default_str();
  app.add_flag("--sm-split", sm_split,
               "With --device cuda --transport local (every stage on GPU 0): give each stage its own 1/P of the GPU's "
               "multiprocessors (CUDA green contexts), so the stages run side by side as on smaller GPUs instead of "
               "taking turns on the whole GPU (memory bandwidth and L2 stay shared)");
}

bool PipelineOptions::recompute_full() const {
  SF_CHECK(recompute == "none" || recompute == "full", "--recompute '", recompute, "': use none or full");
  return recompute == "full";
}

void PipelineOptions::apply_launch_flags() const {
  set_launch_flags({{rank, world_size, local_rank}, rendezvous});
}

// A --chunk-lengths value that is not a list of numbers names a plan file.
static bool names_a_file(const std::string& text) { return text.find_first_not_of("0123456789, ") != std::string::npos; }

std::vector<int64_t> PipelineOptions::resolve_chunks(int64_t seq_len) const {
  SF_CHECK(!(chunks_auto && !chunk_lengths.empty()), "--chunks auto and --chunk-lengths both choose the chunks: give one");
  if (!chunk_lengths.empty()) {
    if (names_a_file(chunk_lengths)) return chunk_lengths_from_plan_file(chunk_lengths, seq_len);
    std::vector<int64_t> l = parse_chunk_lengths(chunk_lengths);
    validate_chunk_lengths(l, seq_len);
    return l;
  }
  return even_chunk_lengths(seq_len, chunks);
}

PlanSpace PipelineOptions::auto_chunk_space(const ModelConfig& m, DType dtype, Device device, int64_t batch,
                                            int64_t seq_len, bool recompute, double memory_bytes) const {
  // Every process would profile on its own and could choose other chunks than its peers.
  const std::optional<RankInfo> launched = detect_rank({rank, world_size, local_rank}, process_environment());
  SF_CHECK(transport != "mpi" && (!launched || launched->world_size == 1),
           "--chunks auto runs in one process; with several, plan once (stateflow plan --auto ... --write-plan "
           "plan.json) and give every rank --chunk-lengths plan.json");
  PlanSpace space;
  space.model = m, space.dtype = dtype, space.device = device;
  space.stages = stages, space.batch = batch, space.seq_len = seq_len;
  space.schedules = {schedule}, space.microbatches = {microbatches}, space.recompute = {recompute};
  space.multiple = chunk_multiple > 0 ? chunk_multiple : default_chunk_multiple(m, device);
  space.memory_bytes = memory_bytes;
  // The local transport runs every stage on GPU 0: one action at a time, one memory; with
  // --sm-split, side by side on parts of its SMs, one memory.
  const bool one_gpu = device == Device::CUDA && stages > 1 &&
                       choose_transport(transport, device, stages, nccl_gpus(), 0).name == "local";
  space.shared_device = one_gpu && !sm_split;
  space.split_sms = one_gpu && sm_split;
  return space;
}

void CheckpointOptions::add(CLI::App& app, bool with_device) {
  app.add_option("--resume", resume,
                 "The trained model: a --save-dir of stateflow train (its newest complete checkpoint) or one of its "
                 "step-NNNNNN directories")
      ->required();
  if (with_device)
    app.add_option("--device", device, "Where the model runs: cpu, or cuda (f32 checkpoints; bf16 GEMMs)")
        ->capture_default_str();
}

LoadedModel CheckpointOptions::load() const {
  const Device d = parse_device(device);
  init_device(d);
  return load_model_from_checkpoint(resume, d);
}

std::vector<int64_t> PipelineOptions::given_chunk_lengths() const {
  if (chunk_lengths.empty()) return {};
  return names_a_file(chunk_lengths) ? chunk_lengths_from_plan_file(chunk_lengths, 0) : parse_chunk_lengths(chunk_lengths);
}

void add_data_parallel_option(CLI::App& app, int& data_parallel) {
  app.add_option("--data-parallel", data_parallel,
                 "Data-parallel replicas D of the pipeline: world = --stages x D processes (mpirun, torchrun or "
                 "srun), each replica takes --batch / D sequences, gradients are summed over the replicas "
                 "(0: world size / --stages; 1 in a single process)")
      ->capture_default_str();
}

void DataOptions::add(CLI::App& app) {
  app.add_option("--data", data.kind,
                 "Training data: recall (built-in associative recall task), text (a file read as bytes), tokens "
                 "(the .json manifest of tools/prepare_data.py), tokens-u16 or tokens-u32 (raw binary token files)")
      ->capture_default_str();
  app.add_option("--data-path", data.path, "File for --data text|tokens|tokens-u16|tokens-u32");
  app.add_option("--data-vocab", data.vocab_size,
                 "Vocabulary of the data (0: the model's vocab for recall, 256 for text, a manifest's for tokens); "
                 "raw token files need it");
  app.add_option("--data-seed", data.seed, "Seed of the recall task's generator")->capture_default_str();
  app.add_option("--recall-pairs", data.recall.num_pairs, "Recall task: key-value pairs per sequence")
      ->capture_default_str();
  app.add_option("--recall-queries", data.recall.num_queries, "Recall task: queries per sequence")
      ->capture_default_str();
}

}  // namespace stateflow::cli
