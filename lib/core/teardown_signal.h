#pragma once
// How the launcher tells a rank why it is stopping it. A SIGTERM sent with sigqueue() carrying
// kTeardownForFailedRank means "another rank failed"; a plain SIGTERM (kill, Ctrl-C at the
// launcher, the scheduler) means "the job was stopped". A rank's tracking records the first as a
// FAILED run and the second as KILLED. Across nodes the root launcher tells each node agent with a
// control line (launcher/node_agent.h), and the agent passes the same SIGTERM on to its ranks.

#include <csignal>

namespace dstrain {

inline constexpr int kTeardownForFailedRank = 0x64737446;  // "dstF"

// For an SA_SIGINFO handler: whether this delivery is the launcher's "another rank failed".
inline bool is_teardown_for_failed_rank(const siginfo_t* info) noexcept {
  return info != nullptr && info->si_code == SI_QUEUE &&
         info->si_value.sival_int == kTeardownForFailedRank;
}

// A signal handler's delivery as one byte for a self-pipe (async-signal-safe): the signal number,
// with kPeerFailedBit set when it is the launcher's "another rank failed" SIGTERM.
inline constexpr unsigned char kPeerFailedBit = 0x80;
inline unsigned char signal_byte(int signo, const siginfo_t* info) noexcept {
  return static_cast<unsigned char>(signo |
                                    (is_teardown_for_failed_rank(info) ? kPeerFailedBit : 0));
}
inline int signal_of_byte(unsigned char byte) noexcept {
  return byte & ~kPeerFailedBit;
}
inline bool peer_failed_of_byte(unsigned char byte) noexcept {
  return (byte & kPeerFailedBit) != 0;
}

// Sends that SIGTERM to `pid` (async-signal-safe); returns sigqueue()'s result.
inline int send_teardown_for_failed_rank(pid_t pid) noexcept {
  union sigval value {};
  value.sival_int = kTeardownForFailedRank;
  return ::sigqueue(pid, SIGTERM, value);
}

}  // namespace dstrain
