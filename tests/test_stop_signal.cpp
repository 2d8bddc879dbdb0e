// Stop requests by signal: the handler records SIGUSR1 and SIGTERM and nothing else
// happens to the process (the training loop acts on it at the next step boundary).
#include <gtest/gtest.h>

#include <csignal>

#include "pipetrain/runtime/stop_signal.hpp"

namespace pipetrain {
namespace {

TEST(StopSignal, RecordsUsr1AndTermWithoutStoppingTheProcess) {
  install_stop_signals();
  clear_stop_signal();
  EXPECT_EQ(stop_signal_received(), 0);
  ASSERT_EQ(std::raise(SIGUSR1), 0);
  EXPECT_EQ(stop_signal_received(), SIGUSR1);
  ASSERT_EQ(std::raise(SIGTERM), 0);
  EXPECT_EQ(stop_signal_received(), SIGTERM);
  clear_stop_signal();
  EXPECT_EQ(stop_signal_received(), 0);
  std::signal(SIGUSR1, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
}

}  // namespace
}  // namespace pipetrain
