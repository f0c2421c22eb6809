#include "comm/collective_error.h"

#include <algorithm>
#include <cctype>

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include "core/error.h"

namespace dstrain::comm {
namespace {

std::string first_line(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string text = c10_error ? c10_error->what_without_backtrace() : e.what();
  return text.substr(0, text.find('\n'));
}

bool mentions_timeout(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return text.find("timed out") != std::string::npos || text.find("timeout") != std::string::npos;
}

}  // namespace

void throw_collective_error(CollectiveKind kind, uint64_t seq, const FailureContext& context,
                            std::exception_ptr cause, const std::string& what) {
  try {
    std::rethrow_exception(cause);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    std::string why = first_line(e);
    bool timed_out = mentions_timeout(why);
    std::string peers = context.heartbeat ? context.heartbeat->diagnose(seq, kind) : "";
    std::string message = fmt::format(
        "{} failed on rank {} of {}{}: {}", what.empty() ? to_string(kind) : what, context.rank,
        context.world_size,
        timed_out ? fmt::format(" after the {} s timeout", context.timeout.count() / 1000.0) : "",
        why);
    if (!peers.empty()) message += "; " + peers;
    throw Error(timed_out ? ErrorKind::kTimeout : ErrorKind::kComm, message);
  }
}

}  // namespace dstrain::comm
