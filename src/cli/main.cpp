// stateflow: exact sequence-pipeline training of linear-recurrence language models.
#include <iostream>

#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"stateflow: train Gated DeltaNet language models chunk by chunk, with exact gradients"};
  app.require_subcommand(1);
  stateflow::cli::add_train_command(app);
  stateflow::cli::add_verify_command(app);
  stateflow::cli::add_bench_command(app);
  stateflow::cli::add_plan_command(app);
  stateflow::cli::add_eval_command(app);
  stateflow::cli::add_generate_command(app);
  stateflow::cli::add_export_command(app);
  stateflow::cli::add_import_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const stateflow::cli::ExitCode& e) {
    return e.code;
  } catch (const stateflow::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
