#pragma once
// A background thread that runs a producer ahead of the consumer, holding at most `capacity` items.
//
// Contract:
//  - next() returns items in production order; it blocks while the queue is empty and the producer
//    is still running, and returns nullopt once the producer signalled the end (returned nullopt).
//  - An exception thrown by the producer is delivered by next() after the items produced before it,
//    and again on every later call: the consumer sees the failure where it happened.
//  - The destructor stops the producer (it finishes the item in progress, which is discarded) and
//    joins the thread, so destroying a Prefetcher early never leaks or hangs.
// next() must be called from one thread at a time.

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

namespace dstrain::data {

template <typename T>
class Prefetcher {
 public:
  using Producer = std::function<std::optional<T>()>;

  Prefetcher(Producer producer, size_t capacity)
      : producer_(std::move(producer)), capacity_(capacity < 1 ? 1 : capacity) {
    thread_ = std::thread([this] { run(); });
  }
  ~Prefetcher() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    not_full_.notify_all();
    thread_.join();
  }
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  std::optional<T> next() {
    std::unique_lock<std::mutex> lock(mutex_);
    not_empty_.wait(lock, [this] { return !queue_.empty() || done_; });
    if (queue_.empty()) {
      if (error_) std::rethrow_exception(error_);
      return std::nullopt;
    }
    std::optional<T> item = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    not_full_.notify_one();
    return item;
  }

 private:
  void run() {
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        not_full_.wait(lock, [this] { return stop_ || queue_.size() < capacity_; });
        if (stop_) return;
      }
      std::optional<T> item;
      try {
        item = producer_();
      } catch (...) {
        finish(std::current_exception());
        return;
      }
      if (!item) {
        finish(nullptr);
        return;
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (stop_) return;
        queue_.push_back(std::move(*item));
      }
      not_empty_.notify_one();
    }
  }

  void finish(std::exception_ptr error) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      error_ = error;
      done_ = true;
    }
    not_empty_.notify_all();
  }

  Producer producer_;
  size_t capacity_;
  std::mutex mutex_;
  std::condition_variable not_empty_, not_full_;
  std::deque<T> queue_;
  std::exception_ptr error_;
  bool done_ = false;
  bool stop_ = false;
  std::thread thread_;  // last: started after every other member exists
};

}  // namespace dstrain::data
