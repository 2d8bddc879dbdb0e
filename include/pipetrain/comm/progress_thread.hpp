// Drives MPI's progress engine from a helper thread while nonblocking operations are in
// flight, so that a bucketed all-reduce advances during a long kernel (a product, AdamW)
// and not only when the executor polls between layers. Between hold() and release() it
// calls MPI_Iprobe on MPI_COMM_SELF — nobody sends there: the call only runs the engine,
// which advances every pending request of the process — and sleeps `period` between
// calls, so it costs almost no CPU. It touches no request, so owners wait and test theirs
// as before. Needs MPI_THREAD_MULTIPLE (main asks for it); without it nothing starts.
// Exports: ProgressThread.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

namespace pipetrain {

class ProgressThread {
 public:
  explicit ProgressThread(std::chrono::microseconds period = std::chrono::microseconds(50));
  ~ProgressThread();  // stops and joins
  ProgressThread(const ProgressThread&) = delete;
  ProgressThread& operator=(const ProgressThread&) = delete;

  // True when MPI runs with MPI_THREAD_MULTIPLE (the thread then exists).
  static bool supported();
  bool running() const { return worker_.joinable(); }

  void hold();     // work is in flight: keep the engine turning (counted; nests)
  void release();  // one hold fewer; at zero the thread sleeps until the next hold
  uint64_t polls() const { return polls_.load(); }  // engine calls made so far

 private:
  void loop();

  std::chrono::microseconds period_;
  std::mutex mutex_;
  std::condition_variable wake_;
  int holds_ = 0;
  bool stop_ = false;
  std::atomic<uint64_t> polls_{0};
  std::thread worker_;
};

}  // namespace pipetrain
