#pragma once
// Calls of ATen operators by name while an OpCalls is alive, on every thread (the autograd
// engine's included), through ATen's RecordFunction callbacks, the profiler's mechanism. For tests
// that check what a forward or backward runs. One OpCalls at a time (the counts are process-wide).

#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include <ATen/record_function.h>

namespace dstrain::model::testing {

class OpCalls {
 public:
  OpCalls() {
    const std::lock_guard<std::mutex> lock(mutex());
    counts().clear();
    handle_ = at::addGlobalCallback(
        at::RecordFunctionCallback(&OpCalls::on_call).scopes({at::RecordScope::FUNCTION}));
  }
  ~OpCalls() { at::removeCallback(handle_); }
  OpCalls(const OpCalls&) = delete;
  OpCalls& operator=(const OpCalls&) = delete;

  // Calls of the operator `name` ("aten::mm").
  int count(const std::string& name) const {
    const std::lock_guard<std::mutex> lock(mutex());
    const auto it = counts().find(name);
    return it == counts().end() ? 0 : it->second;
  }
  // Calls of the operators whose names start with `prefix`, backward ones (named *backward*)
  // left out or only those.
  int count_prefix(const std::string& prefix, bool backward) const {
    const std::lock_guard<std::mutex> lock(mutex());
    int n = 0;
    for (const auto& [name, calls] : counts()) {
      const bool is_backward = name.find("backward") != std::string::npos;
      if (name.rfind(prefix, 0) == 0 && is_backward == backward) n += calls;
    }
    return n;
  }

 private:
  static std::unique_ptr<at::ObserverContext> on_call(const at::RecordFunction& fn) {
    const std::lock_guard<std::mutex> lock(mutex());
    ++counts()[fn.name()];
    return nullptr;
  }
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::map<std::string, int>& counts() {
    static std::map<std::string, int> c;
    return c;
  }
  at::CallbackHandle handle_;
};

}  // namespace dstrain::model::testing
