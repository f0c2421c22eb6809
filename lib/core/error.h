#pragma once
// The one error type of dstrain. Library code throws `Error` (never calls exit()); the CLI catches
// it at the top and turns its kind into the process exit code. Messages are complete sentences that
// name the file, key or line at fault and what was expected, because they are what the user sees.

#include <stdexcept>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace dstrain {

enum class ErrorKind {
  kUsage,           // bad command line: unknown flag, missing argument            → exit 2
  kConfig,          // config file: syntax, unknown key, bad value, cross-field rule → exit 2
  kInput,           // bad user input file: hostfile, dataset, tokenizer, checkpoint → exit 2
  kIo,              // the OS refused: cannot read/write/create                     → exit 1
  kComm,            // collectives, rendezvous, peers                                → exit 1
  kTimeout,         // something did not happen in time                             → exit 1
  kRuntime,         // a run failed for another reason (e.g. a rank died)            → exit 1
  kNotImplemented,  // a capability that this build does not have yet               → exit 3
  kInternal,        // a bug in dstrain                                              → exit 70
};

const char* to_string(ErrorKind kind) noexcept;

// Process exit code for an error of this kind (2 for bad input of any sort).
int exit_code(ErrorKind kind) noexcept;

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string message)
      : std::runtime_error(std::move(message)), kind_(kind) {}
  ErrorKind kind() const noexcept { return kind_; }

 private:
  ErrorKind kind_;
};

// Throws Error(kind, fmt::format(...)).
template <typename... Args>
[[noreturn]] void fail(ErrorKind kind, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(kind, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace dstrain
