#pragma once
// One thread that runs submitted jobs in submission order. Every collective of a communicator runs
// here, so collectives are issued to Gloo in program order on every rank (which is what makes their
// matching across ranks correct) while the caller's thread goes on computing (overlap).

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

namespace dstrain::comm {

class SerialExecutor {
 public:
  SerialExecutor();
  // Runs the jobs already submitted, then stops the thread.
  ~SerialExecutor();
  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;

  // The future holds the job's exception, if it threw.
  std::shared_future<void> submit(std::function<void()> job);

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace dstrain::comm
