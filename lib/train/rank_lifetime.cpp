#include "train/rank_lifetime.h"

#include <signal.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "core/log.h"

namespace dstrain::train {
namespace {

// A rank started by the launcher knows when its SIGKILL follows a SIGTERM (--grace): it keeps
// kExitSeconds of that for the rest of its exit (the trackers' last second included), at least
// half of it, at most kMaxEndSeconds; 2.5 s fit the default grace of 5 s, and are what a rank
// started otherwise takes.
constexpr double kMaxEndSeconds = 30;
constexpr double kExitSeconds = 2.5;

void on_sigusr1(int) {
  RankLifetime::stop_requested().store(true);
}

void set_sigusr1(void (*handler)(int)) {
  struct sigaction sa {};
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &sa, nullptr);
}

}  // namespace

std::atomic<bool>& RankLifetime::stop_requested() {
  static std::atomic<bool> flag{false};
  return flag;
}

RankLifetime::RankLifetime() : beat_(liveness::start_beat_from_env()) {
  const std::optional<double> grace = teardown::grace_from_env();
  end_seconds_ =
      grace ? std::min(kMaxEndSeconds, std::max(*grace / 2, *grace - kExitSeconds)) : kExitSeconds;
  set_sigusr1(on_sigusr1);
  watch_ = std::make_unique<metrics::TerminationWatch>(
      [this](int signo, const std::optional<teardown::RankFailure>& failure) {
        ended(signo, failure);
      },
      teardown::reason_fd_from_env());
}

RankLifetime::~RankLifetime() {
  watch_.reset();
  set_sigusr1(SIG_DFL);
}

void RankLifetime::ended(int signo, const std::optional<teardown::RankFailure>& failure) {
  log::warn("{} ({}): stopping", ::strsignal(signo),
            failure ? "the launcher stops the job: " + teardown::describe(*failure)
                    : std::string("the job was stopped"));
  std::lock_guard<std::mutex> lock(mutex_);
  for (const OnEnd& fn : on_end_) {
    if (fn) fn(signo, failure, end_seconds_);
  }
}

RankLifetime::EndHandle RankLifetime::on_end(OnEnd fn) {
  std::lock_guard<std::mutex> lock(mutex_);
  on_end_.push_back(std::move(fn));
  return EndHandle(this, on_end_.size() - 1);
}

RankLifetime::EndHandle::EndHandle(EndHandle&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)), slot_(other.slot_) {}

RankLifetime::EndHandle& RankLifetime::EndHandle::operator=(EndHandle&& other) noexcept {
  if (this != &other) {
    release();
    owner_ = std::exchange(other.owner_, nullptr);
    slot_ = other.slot_;
  }
  return *this;
}

RankLifetime::EndHandle::~EndHandle() {
  release();
}

void RankLifetime::EndHandle::release() noexcept {
  if (owner_ == nullptr) return;
  std::lock_guard<std::mutex> lock(owner_->mutex_);
  owner_->on_end_[slot_] = nullptr;
  owner_ = nullptr;
}

}  // namespace dstrain::train
