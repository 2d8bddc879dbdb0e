// Hang watchdog. Each rank runs one background thread; blocking waits (receives,
// collectives) announce themselves with a `watchdog::Waiting` scope and the runtime
// keeps `set_position` up to date. If one wait lasts longer than the timeout, the rank
// prints where it is in its action list and what it waits for, and ends the process
// with exit status 3 (the launcher then ends the job). A rank that is waiting when the
// launcher's SIGTERM arrives prints its position too, so every stuck rank reports.
#pragma once
#include <string>

namespace pipetrain::watchdog {

// Starts the thread (timeout_s <= 0: no watchdog). `rank` labels the messages.
void start(double timeout_s, int rank);
void stop();
// Where this rank is ("step 3, action 5 of 16: 1B2").
void set_position(std::string where);
// Called from a signal handler context-free path: asks the thread to report now.
void report_on_signal();

class Waiting {
 public:
  explicit Waiting(std::string what);
  ~Waiting();
  Waiting(const Waiting&) = delete;
  Waiting& operator=(const Waiting&) = delete;
};

}  // namespace pipetrain::watchdog
