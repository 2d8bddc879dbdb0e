// Stop requests by signal: SIGUSR1 (Slurm's --signal=USR1@T before the time limit) and
// SIGTERM (pre-emption, scancel). The handler only records the signal (and lets the hang
// watchdog say where a stuck rank waits); the training loop agrees on it at the next step
// boundary, checkpoints and returns. Exports: install_stop_signals, stop_signal_received,
// clear_stop_signal.
#pragma once

namespace pipetrain {

// Installs the handler for SIGUSR1 and SIGTERM (idempotent).
void install_stop_signals();
// The last stop signal received by this process (0: none).
int stop_signal_received();
// Forgets a received signal (a test, or a loop that handled it).
void clear_stop_signal();

}  // namespace pipetrain
