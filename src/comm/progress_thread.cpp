// ProgressThread (pipetrain/comm/progress_thread.hpp).
#include "pipetrain/comm/progress_thread.hpp"

#include <mpi.h>

namespace pipetrain {

bool ProgressThread::supported() {
  int init = 0, level = MPI_THREAD_SINGLE;
  MPI_Initialized(&init);
  if (!init) return false;
  MPI_Query_thread(&level);
  return level == MPI_THREAD_MULTIPLE;
}

ProgressThread::ProgressThread(std::chrono::microseconds period) : period_(period) {
  if (supported()) worker_ = std::thread([this] { loop(); });
}

ProgressThread::~ProgressThread() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void ProgressThread::hold() {
  {
    std::lock_guard lock(mutex_);
    ++holds_;
  }
  wake_.notify_all();
}

void ProgressThread::release() {
  std::lock_guard lock(mutex_);
  if (holds_ > 0) --holds_;
}

void ProgressThread::loop() {
  std::unique_lock lock(mutex_);
  while (!stop_) {
    wake_.wait(lock, [this] { return stop_ || holds_ > 0; });
    while (!stop_ && holds_ > 0) {
      lock.unlock();
      int flag = 0;
      MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_SELF, &flag, MPI_STATUS_IGNORE);
      polls_.fetch_add(1, std::memory_order_relaxed);
      std::this_thread::sleep_for(period_);
      lock.lock();
    }
  }
}

}  // namespace pipetrain
