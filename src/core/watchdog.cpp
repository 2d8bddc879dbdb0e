#include "pipetrain/core/watchdog.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

namespace pipetrain::watchdog {

namespace {

using Clock = std::chrono::steady_clock;

struct State {
  std::mutex mutex;
  std::condition_variable cv;
  std::thread thread;
  bool running = false;
  double timeout_s = 0;
  int rank = 0;
  std::string position = "starting up";
  std::string waiting_for;  // empty: not waiting
  Clock::time_point wait_start;
  Clock::time_point position_since = Clock::now();
  std::atomic<bool> signal_report{false};
};

State& state() {
  static State s;
  return s;
}

void print(State& s, const char* why, double waited) {
  if (s.waiting_for.empty())
    std::fprintf(stderr, "pipetrain: rank %d %s: at %s (not waiting for any message)\n", s.rank, why,
                 s.position.c_str());
  else
    std::fprintf(stderr, "pipetrain: rank %d %s: at %s, waiting %.0f s for %s\n", s.rank, why, s.position.c_str(),
                 waited, s.waiting_for.c_str());
  std::fflush(stderr);
}

void loop() {
  State& s = state();
  std::unique_lock lock(s.mutex);
  while (s.running) {
    s.cv.wait_for(lock, std::chrono::milliseconds(200));
    if (!s.running) break;
    const auto now = Clock::now();
    const double waited = std::chrono::duration<double>(now - s.wait_start).count();
    // Stopped by the launcher (or a pre-emption) while stuck at one place: say where.
    if (s.signal_report.exchange(false) &&
        std::chrono::duration<double>(now - s.position_since).count() > 2.0)
      print(s, "was stopped while stuck", waited);
    if (s.waiting_for.empty()) continue;
    if (waited > s.timeout_s) {
      print(s, "made no progress (runtime.timeout_s exceeded)", waited);
      // Give the other ranks' watchdogs a moment to report, then end this process; the
      // launcher ends the job.
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::seconds(2));
      std::_Exit(3);
    }
  }
}

}  // namespace

void start(double timeout_s, int rank) {
  State& s = state();
  if (timeout_s <= 0 || s.running) return;
  s.timeout_s = timeout_s;
  s.rank = rank;
  s.running = true;
  s.thread = std::thread(loop);
}

void stop() {
  State& s = state();
  {
    std::lock_guard lock(s.mutex);
    if (!s.running) return;
    s.running = false;
  }
  s.cv.notify_all();
  s.thread.join();
}

void set_position(std::string where) {
  State& s = state();
  if (!s.running) return;
  std::lock_guard lock(s.mutex);
  s.position = std::move(where);
  s.position_since = Clock::now();
}

void report_on_signal() { state().signal_report = true; }

Waiting::Waiting(std::string what) {
  State& s = state();
  if (!s.running) return;
  std::lock_guard lock(s.mutex);
  s.waiting_for = std::move(what);
  s.wait_start = Clock::now();
}

Waiting::~Waiting() {
  State& s = state();
  if (!s.running) return;
  std::lock_guard lock(s.mutex);
  s.waiting_for.clear();
}

}  // namespace pipetrain::watchdog
