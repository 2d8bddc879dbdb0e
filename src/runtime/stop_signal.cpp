// Stop requests by signal (pipetrain/runtime/stop_signal.hpp).
#include "pipetrain/runtime/stop_signal.hpp"

#include <csignal>

#include "pipetrain/core/watchdog.hpp"

namespace pipetrain {

namespace {

volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void on_stop_signal(int sig) {
  g_stop_signal = sig;
  watchdog::report_on_signal();  // a rank stuck in a wait says where it is
}

}  // namespace

void install_stop_signals() {
  std::signal(SIGUSR1, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
}

int stop_signal_received() { return static_cast<int>(g_stop_signal); }

void clear_stop_signal() { g_stop_signal = 0; }

}  // namespace pipetrain
