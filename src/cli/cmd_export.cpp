// `stateflow export` and `stateflow import`: checkpoints to and from a Hugging Face folder of
// flash-linear-attention's GatedDeltaNetForCausalLM (train/hf_format.h has the mapping).
#include <iostream>

#include "cli/commands.h"
#include "cli/common.h"
#include "pipeline/pipeline.h"
#include "train/hf_format.h"
#include "train/train_options.h"

namespace stateflow::cli {

static void check_format(const std::string& format) {
  SF_CHECK(format == "hf", "--format ", format, ": the one format is hf (a Hugging Face folder of ",
           "flash-linear-attention's GatedDeltaNetForCausalLM)");
}

void add_export_command(CLI::App& root) {
  auto* app = root.add_subcommand(
      "export", "Write a checkpoint as a Hugging Face folder (config.json + model.safetensors, f32) that "
                "flash-linear-attention's GatedDeltaNetForCausalLM loads with transformers");
  auto ckpt = std::make_shared<CheckpointOptions>();
  auto format = std::make_shared<std::string>("hf");
  auto dir = std::make_shared<std::string>();
  ckpt->add(*app, false);
  app->add_option("--format", *format, "Output format: hf")->capture_default_str();
  app->add_option("dir", *dir, "Folder to write (created if missing)")->required();
  app->callback([=]() {
    check_format(*format);
    LoadedModel m = ckpt->load();
    export_hf(*m.model, *dir);
    std::cout << "exported " << m.step_dir << " (step " << m.state.step << ", " << m.model->config().num_parameters()
              << " parameters) to " << *dir << ": config.json, model.safetensors\n"
              << "load it with: AutoModelForCausalLM.from_pretrained(\"" << *dir << "\") after `import fla`\n";
  });
}

void add_import_command(CLI::App& root) {
  auto* app = root.add_subcommand(
      "import", "Turn a Hugging Face folder of flash-linear-attention's GatedDeltaNetForCausalLM into a stateflow "
                "checkpoint (step 0, fresh optimizer state) that train, eval and generate --resume; --data names "
                "what `train --resume` will train it on");
  auto format = std::make_shared<std::string>("hf");
  auto dir = std::make_shared<std::string>();
  auto save_dir = std::make_shared<std::string>();
  auto dtype = std::make_shared<std::string>("f32");
  auto data = std::make_shared<DataOptions>();  // what `train --resume` continues on
  app->add_option("--format", *format, "Input format: hf")->capture_default_str();
  app->add_option("dir", *dir, "The Hugging Face model folder (config.json, model.safetensors)")->required();
  app->add_option("--save-dir", *save_dir, "Where to write the checkpoint (DIR/step-000000/)")->required();
  app->add_option("--dtype", *dtype, "Precision of the checkpoint's weights: f32 or f64")->capture_default_str();
  data->add(*app);
  app->callback([=]() {
    check_format(*format);
    TrainOptions o;
    o.model = model_config_of_hf(read_hf_config(*dir), *dir + "/config.json");
    o.dtype = parse_dtype(*dtype);
    o.stages = 1, o.microbatches = 1, o.chunks = 1;
    o.save_dir = *save_dir;
    o.data = data->data;  // the data stream a resumed run starts at position 0 of
    SF_CHECK(data_vocab_size(o.data) <= o.model.vocab_size, "the data uses ", data_vocab_size(o.data),
             " token ids but the imported model's vocab_size is ", o.model.vocab_size,
             ": use data tokenized with the model's tokenizer");
    o.validate();
    std::unique_ptr<Pipeline> pipeline = make_local_pipeline(o.pipeline_config());
    load_hf_weights(pipeline->stages().front()->model(), *dir);
    const std::string step_dir = save_checkpoint(*pipeline, *save_dir, {0, 0, 0, o.to_json()}, 0);
    std::cout << "imported " << *dir << " (" << o.model.num_parameters() << " parameters) as " << step_dir << "\n"
              << "continue training with: stateflow train --resume " << *save_dir << " --steps N (on --data "
              << o.data.kind << (o.data.path.empty() ? "" : " " + o.data.path) << ")\n";
  });
}

}  // namespace stateflow::cli
