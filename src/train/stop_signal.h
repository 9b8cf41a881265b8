// SIGINT and SIGTERM as a request to stop: the handler only records which signal came, and
// the training loop checks between steps, saves a checkpoint and exits (128 + signal). The
// handler is installed with SA_RESETHAND, so a second signal ends the process at once.
#pragma once

namespace stateflow {

void install_stop_handlers();
int stop_signal();  // the signal received since install_stop_handlers(), or 0
const char* signal_name(int sig);  // "SIGINT", "SIGTERM", or "signal N"

}  // namespace stateflow
