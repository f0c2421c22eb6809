#pragma once
// A counting CPU allocator for memory tests: bytes LibTorch's CPU allocator hands out now and at
// most since the last reset (process-wide counters; blocks freed after a scope ends are counted
// down correctly, their deleter does not use the allocator).

#include <atomic>
#include <cstdint>
#include <cstring>

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
  void reset_peak() { peak_ = current_.load(); }
  int64_t current() const { return current_; }
  int64_t peak() const { return peak_; }

 private:
  struct Block {
    c10::DataPtr inner;
    size_t bytes;
  };
  static void release(void* ctx) {
    auto* block = static_cast<Block*>(ctx);
    current_ -= static_cast<int64_t>(block->bytes);
    delete block;
  }
  static c10::DataPtr wrap(c10::DataPtr inner, size_t n) {
    void* data = inner.get();
    const c10::Device device = inner.device();
    const int64_t now = current_ += static_cast<int64_t>(n);
    int64_t seen = peak_;
    while (now > seen && !peak_.compare_exchange_weak(seen, now)) {
    }
    return {data, new Block{std::move(inner), n}, &release, device};
  }
  c10::Allocator* inner_;
  static inline std::atomic<int64_t> current_{0};
  static inline std::atomic<int64_t> peak_{0};
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
