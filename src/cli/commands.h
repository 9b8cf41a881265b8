// The subcommands of the `stateflow` program; each registers itself on the root app.
#pragma once
#include <CLI/CLI.hpp>

namespace stateflow::cli {

// Thrown by a command that finished its report but must exit non-zero.
struct ExitCode {
  explicit ExitCode(int c) : code(c) {}  // clang 14 has no aggregate init from parentheses
  int code;
};

void add_train_command(CLI::App& root);
void add_verify_command(CLI::App& root);
void add_bench_command(CLI::App& root);
void add_plan_command(CLI::App& root);
void add_eval_command(CLI::App& root);
void add_generate_command(CLI::App& root);
void add_export_command(CLI::App& root);
void add_import_command(CLI::App& root);

}  // namespace stateflow::cli
