#include "core/error.h"

namespace dstrain {

const char* to_string(ErrorKind kind) noexcept {
  switch (kind) {
    case ErrorKind::kUsage:
      return "usage error";
    case ErrorKind::kConfig:
      return "config error";
    case ErrorKind::kInput:
      return "input error";
    case ErrorKind::kIo:
      return "I/O error";
    case ErrorKind::kComm:
      return "communication error";
    case ErrorKind::kTimeout:
      return "timeout";
    case ErrorKind::kRuntime:
      return "error";
    case ErrorKind::kNotImplemented:
      return "not implemented";
    case ErrorKind::kInternal:
      return "internal error";
  }
  return "error";
}

int exit_code(ErrorKind kind) noexcept {
  switch (kind) {
    case ErrorKind::kUsage:
    case ErrorKind::kConfig:
    case ErrorKind::kInput:
      return 2;
    case ErrorKind::kNotImplemented:
      return 3;
    case ErrorKind::kInternal:
      return 70;
    default:
      return 1;
  }
}

}  // namespace dstrain
