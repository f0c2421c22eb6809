#pragma once
// How the launcher tells a rank why it is stopping it. A SIGTERM sent with sigqueue() carrying
// kTeardownForFailedRank means "another rank failed"; a plain SIGTERM (kill, Ctrl-C at the
// launcher, the scheduler) means "the job was stopped". A rank's tracking records the first as a
// FAILED run and the second as KILLED.

namespace dstrain {

inline constexpr int kTeardownForFailedRank = 0x64737446;  // "dstF"

}  // namespace dstrain
