#pragma once
// A counting CPU allocator for memory tests and benchmarks: bytes LibTorch's CPU allocator hands
// out now and at most since the last reset, for the process and for each thread (what a thread
// allocated, counted down wherever it is freed: ranks as threads each count their own; blocks
// freed after a scope ends are counted down correctly, their deleter does not use the allocator). A
// block's context is its data pointer, as raw_allocate() (used by oneDNN's scratch buffers)
// requires.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <deque>
#include <mutex>
#include <unordered_map>

#include <c10/core/CPUAllocator.h>

namespace dstrain::model::testing {

// Counts the bytes the CPU allocator hands out: current and peak since reset.
class CountingAllocator : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) {}
  // No `override`: LibTorch 2.x made allocate non-const and added copy_data; defining both
  // spellings overrides whichever the installed LibTorch declares.
  c10::DataPtr allocate(size_t n) const { return wrap(inner_->allocate(n), n); }
  c10::DataPtr allocate(size_t n) { return wrap(inner_->allocate(n), n); }
  void copy_data(void* dest, const void* src, std::size_t count) const {
    std::memcpy(dest, src, count);
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void reset_peak() { peak_ = current_.load(); }
  int64_t current() const { return current_; }
  int64_t peak() const { return peak_; }
  // The calling thread's.
  static void reset_thread_peak() { mine().peak = mine().current.load(); }
  static int64_t thread_current() { return mine().current; }
  static int64_t thread_peak() { return mine().peak; }
  // What the calling thread allocated since its last start_thread_count() and has not been freed
  // (wherever it is freed), and the most of that at any moment: unlike thread_current(), blind to
  // blocks allocated before the start that another thread frees meanwhile (a communication
  // library's worker dropping the last reference to a tensor of an earlier collective).
  static void start_thread_count() {
    Thread& t = mine();
    t.epoch += 1;
    t.since = 0;
    t.since_peak = 0;
  }
  static int64_t thread_since() { return mine().since; }
  static int64_t thread_since_peak() { return mine().since_peak; }

 private:
  struct Thread {
    std::atomic<int64_t> current{0};
    int64_t peak = 0;  // written by its thread only
    std::atomic<int64_t> epoch{0};
    std::atomic<int64_t> since{0};
    int64_t since_peak = 0;  // written by its thread only
  };
  struct Block {
    c10::DataPtr inner;
    size_t bytes = 0;
    Thread* owner = nullptr;
    int64_t epoch = 0;  // the owner's when it was allocated
  };
  // The calling thread's counters; they outlive it (a block it allocated may be freed later).
  static Thread& mine() {
    thread_local Thread* self = [] {
      std::lock_guard<std::mutex> lock(mutex_);
      return &threads_.emplace_back();
    }();
    return *self;
  }
  static void release(void* data) {
    Block block;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = blocks_.find(data);
      block = std::move(it->second);
      blocks_.erase(it);
    }
    current_ -= static_cast<int64_t>(block.bytes);
    block.owner->current -= static_cast<int64_t>(block.bytes);
    if (block.epoch == block.owner->epoch) block.owner->since -= static_cast<int64_t>(block.bytes);
  }  // block.inner frees the memory here
  static c10::DataPtr wrap(c10::DataPtr inner, size_t n) {
    void* data = inner.get();
    if (data == nullptr) return inner;  // zero bytes
    const c10::Device device = inner.device();
    Thread& thread = mine();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      blocks_[data] = Block{std::move(inner), n, &thread, thread.epoch};
    }
    const int64_t mine_now = thread.current += static_cast<int64_t>(n);
    thread.peak = std::max(thread.peak, mine_now);
    const int64_t since_now = thread.since += static_cast<int64_t>(n);
    thread.since_peak = std::max(thread.since_peak, since_now);
    const int64_t now = current_ += static_cast<int64_t>(n);
    int64_t seen = peak_;
    while (now > seen && !peak_.compare_exchange_weak(seen, now)) {
    }
    return {data, data, &release, device};
  }
  c10::Allocator* inner_;
  static inline std::atomic<int64_t> current_{0};
  static inline std::atomic<int64_t> peak_{0};
  static inline std::mutex mutex_;
  static inline std::unordered_map<void*, Block> blocks_;
  static inline std::deque<Thread> threads_;
};

// Installs a CountingAllocator as LibTorch's CPU allocator for its lifetime.
class CountingScope {
 public:
  CountingScope() : previous_(c10::GetCPUAllocator()), counting_(previous_) {
    c10::SetCPUAllocator(&counting_);
  }
  ~CountingScope() { c10::SetCPUAllocator(previous_); }
  CountingAllocator& counter() { return counting_; }

 private:
  c10::Allocator* previous_;
  CountingAllocator counting_;
};

}  // namespace dstrain::model::testing
