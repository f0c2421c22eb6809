#pragma once
// Why the launcher stops a rank: told once, over a pipe, before the rank is signalled.
//
// The process that spawns a rank (the launcher, or a node agent on each node:
// launcher/spawn_local.h) gives it the read end of a pipe as descriptor kTeardownFd and names it in
// DSTRAIN_TEARDOWN_FD. When it tears its ranks down because a rank failed, it writes one line
// naming that rank (RankFailure) to every running rank's pipe, and only then sends them SIGTERM. A
// rank that gets SIGTERM or SIGINT reads its pipe without waiting: a line there means "another rank
// failed" (its tracked runs end FAILED), none means "the job was stopped" (KILLED). The line is in
// the pipe before kill() is called, so whichever signal the rank takes first, and on whichever
// thread, the answer is the same. (A value sent with the signal itself cannot give that guarantee:
// the plain SIGTERM to the rank's process group may be the one a thread takes first.)
//
// A line is written at most once per rank and process that spawned it, in one write() shorter than
// PIPE_BUF, so it arrives whole. A rank started without the variable (by hand, by srun without
// `dstrain launch`) has no pipe: every signal then means "the job was stopped".

#include <optional>
#include <string>
#include <string_view>

namespace dstrain::teardown {

inline constexpr int kTeardownFd = 4;
inline constexpr const char* kTeardownFdVar = "DSTRAIN_TEARDOWN_FD";
// The seconds between the SIGTERM the spawning process sends a rank and its SIGKILL (`launch
// --grace`), so that the rank knows how long its own shutdown may take.
inline constexpr const char* kGraceVar = "DSTRAIN_GRACE_SECONDS";

// The rank that failed first, as far as the launcher that saw it knows.
struct RankFailure {
  int rank = -1;      // -1: not known (the root launcher over SSH sees a node's agent fail)
  std::string host;   // "" when not known
  std::string cause;  // "exit code 1", "signal SIGKILL (9)", ...; "" when not known
};

// "rank 3 on node1 failed: signal SIGKILL (9)" (parts not known are left out).
std::string describe(const RankFailure& failure);

// One line, without its newline, that decode() reads back: tabs and line breaks in the host and
// the cause become spaces, and the cause is cut so that the line stays under 512 bytes.
std::string encode(const RankFailure& failure);
// The inverse of encode(); nullopt for anything else.
std::optional<RankFailure> decode(std::string_view line);

// Launcher side: writes encode(failure) and a newline to `fd` in one write(). False when it could
// not (the rank already exited: EPIPE, with SIGPIPE ignored by the caller).
bool send(int fd, const RankFailure& failure);

// Rank side: the descriptor DSTRAIN_TEARDOWN_FD names, made close-on-exec so that programs the rank
// starts do not hold it; -1 when the variable is unset or the descriptor is not a pipe (the
// variable was inherited by a process that does not hold the pipe). Error(kUsage) for a value that
// is not a descriptor number.
int reason_fd_from_env();

// Rank side: DSTRAIN_GRACE_SECONDS, or nullopt when unset (a rank not started by a launcher: the
// time until a SIGKILL, if any comes, is not known). Error(kUsage) for a value that is not a
// number of seconds >= 0.
std::optional<double> grace_from_env();

// Rank side: what the launcher wrote on `fd`, read without waiting; nullopt when nothing was (the
// job was stopped, not torn down for a failed rank) or `fd` is negative.
std::optional<RankFailure> receive(int fd);

}  // namespace dstrain::teardown
