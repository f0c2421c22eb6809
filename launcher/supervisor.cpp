#include "launcher/supervisor.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <memory>

#include <fmt/format.h>

#include "core/error.h"
#include "core/teardown_reason.h"
#include "core/timer.h"
#include "launcher/group_guard.h"
#include "launcher/signals.h"
#include "launcher/spawn_local.h"

namespace dstrain::launcher {
namespace {

constexpr int kPollMillis = 100;  // upper bound between exit checks (SIGCHLD wakes earlier)
constexpr double kFinalDrainSeconds = 2.0;  // reading what is left in pipes after the last exit

struct Slot {
  RankSpec spec;
  LocalProcess proc;
  std::unique_ptr<RankOutput> output;
  bool running = true;
  double last_beat = -1;  // job clock seconds of its last heartbeat; -1 before the first
  RankReport report;
};

class LocalJob {
 public:
  explicit LocalJob(const SupervisorOptions& options) : options_(options) {}

  JobOutcome run(const std::vector<RankSpec>& ranks) {
    try {
      start(ranks);
    } catch (...) {
      kill_all(SIGKILL);
      finish();
      throw;
    }
    supervise();
    finish();
    return outcome();
  }

 private:
  void start(const std::vector<RankSpec>& ranks) {
    for (const RankSpec& spec : ranks) {
      auto slot = std::make_unique<Slot>();
      slot->spec = spec;
      slot->spec.env.emplace_back(teardown::kGraceVar, fmt::format("{}", options_.grace_seconds));
      std::string log_path;
      if (!options_.log_dir.empty()) {
        log_path = options_.log_dir + "/rank_" + std::to_string(spec.rank) + ".log";
      }
      slot->output =
          std::make_unique<RankOutput>(spec.rank, log_path, options_.targets, options_.tail_lines);
      slot->proc = spawn_local(slot->spec);
      guard_.watch(slot->proc.pid);
      slots_.push_back(std::move(slot));
    }
  }

  void supervise() {
    while (any_running()) {
      pump_output(kPollMillis);
      handle_signals();
      collect_exits();
      find_frozen_rank();
      if (tearing_down_ && !killed_ && clock_.seconds() >= kill_at_) kill_all(SIGKILL);
    }
  }

  // Kills whatever is left in the ranks' groups, drains the pipes, flushes partial lines, reaps.
  void finish() {
    kill_all(SIGKILL);
    Stopwatch drain;
    while (any_pipe_open() && drain.seconds() < kFinalDrainSeconds) pump_output(kPollMillis);
    for (auto& slot : slots_) {
      close_fd(slot->proc.stdout_fd);
      close_fd(slot->proc.stderr_fd);
      close_fd(slot->proc.liveness_fd);
      close_fd(slot->proc.teardown_fd);
      slot->output->finish();
      slot->report.tail = slot->output->tail();
    }
    guard_.disarm();  // groups are empty; only now may the leaders be reaped (see group_guard.h)
    for (auto& slot : slots_) reap(*slot);
  }

  // Waits up to `timeout_ms` for output or a signal, then reads every ready pipe once.
  void pump_output(int timeout_ms) {
    if (options_.on_tick) options_.on_tick();
    std::vector<pollfd> fds;
    fds.push_back({signals_.fd(), POLLIN, 0});
    for (auto& slot : slots_) {
      if (slot->proc.stdout_fd >= 0) fds.push_back({slot->proc.stdout_fd, POLLIN, 0});
      if (slot->proc.stderr_fd >= 0) fds.push_back({slot->proc.stderr_fd, POLLIN, 0});
      if (slot->proc.liveness_fd >= 0) fds.push_back({slot->proc.liveness_fd, POLLIN, 0});
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) <= 0) return;
    for (auto& slot : slots_) {
      read_pipe(*slot, slot->proc.stdout_fd, Stream::kStdout);
      read_pipe(*slot, slot->proc.stderr_fd, Stream::kStderr);
      read_beats(*slot);
    }
  }

  void read_beats(Slot& slot) {
    char buf[64];
    bool beat = false;
    while (slot.proc.liveness_fd >= 0 && ::recv(slot.proc.liveness_fd, buf, sizeof buf, 0) > 0)
      beat = true;
    if (beat) slot.last_beat = clock_.seconds();
  }

  double silence(const Slot& slot) const {
    return slot.running && slot.last_beat >= 0 ? clock_.seconds() - slot.last_beat : 0;
  }

  // The rank silent longest, if it has been silent at least `limit` seconds.
  Slot* silent_rank(double limit) {
    Slot* found = nullptr;
    for (auto& slot : slots_) {
      if (silence(*slot) >= limit && (!found || silence(*slot) > silence(*found)))
        found = slot.get();
    }
    return found;
  }

  // A frozen rank gets SIGKILL at once: a stopped process would keep a SIGTERM pending forever.
  void blame_frozen(Slot& slot) {
    slot.report.silent_seconds = silence(slot);
    failed_rank_ = slot.spec.rank;
    ::kill(-slot.proc.pid, SIGKILL);
  }

  void find_frozen_rank() {
    if (tearing_down_ || options_.silence_limit_seconds <= 0) return;
    if (Slot* frozen = silent_rank(options_.silence_limit_seconds)) {
      blame_frozen(*frozen);
      begin_teardown();
    }
  }

  void read_pipe(Slot& slot, int& fd, Stream stream) {
    if (fd < 0) return;
    char buf[65536];
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n > 0) {
      slot.output->write(stream, std::string_view(buf, static_cast<size_t>(n)));
    } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
      close_fd(fd);
    }
  }

  void handle_signals() {
    for (const ReceivedSignal& received : signals_.drain()) {
      const int sig = received.number;
      if (sig == SIGCHLD) continue;  // exits are collected by collect_exits()
      if (sig == SIGUSR1) {          // "checkpoint now" (Slurm preemption): pass it on, keep going
        if (!tearing_down_) signal_all(SIGUSR1);
        continue;
      }
      if (tearing_down_) {
        kill_all(SIGKILL);  // a second interrupt: stop waiting for the grace period
      } else {
        interrupt_signal_ = sig;
        // A node agent stopped because a rank on another node failed (node_agent.h).
        if (options_.failure_elsewhere) failure_elsewhere_ = options_.failure_elsewhere();
        begin_teardown();
      }
    }
  }

  // Records exits without reaping (WNOWAIT): a zombie leader keeps its pid, and so its process
  // group id, reserved until finish() has killed the group.
  void collect_exits() {
    for (auto& slot : slots_) {
      if (!slot->running) continue;
      siginfo_t info{};
      if (::waitid(P_PID, slot->proc.pid, &info, WEXITED | WNOHANG | WNOWAIT) != 0) continue;
      if (info.si_pid == 0) continue;
      slot->running = false;
      slot->report.exit = decode_child_status(info.si_code, info.si_status);
      slot->report.end_seconds = clock_.seconds();
      if (!slot->report.exit.ok() && !tearing_down_) {
        failed_rank_ = slot->spec.rank;
        if (Slot* frozen = silent_rank(kSuspectSilenceSeconds)) blame_frozen(*frozen);
        begin_teardown();
      }
    }
  }

  void begin_teardown() {
    tearing_down_ = true;
    for (auto& slot : slots_) slot->report.stopped_by_launcher = slot->running;
    kill_at_ = clock_.seconds() + options_.grace_seconds;
    if (options_.grace_seconds <= 0) {
      kill_all(SIGKILL);
      return;
    }
    if (const std::optional<teardown::RankFailure> failure = why_tearing_down()) {
      tell_ranks(*failure);
    }
    signal_all(SIGTERM);
  }

  // The failed rank, when one is why the job stops: here, or on another node.
  std::optional<teardown::RankFailure> why_tearing_down() const {
    for (const auto& slot : slots_) {
      if (slot->spec.rank == failed_rank_)
        return teardown::RankFailure{failed_rank_, slot->spec.host, describe(slot->report)};
    }
    return failure_elsewhere_;
  }

  // Before any SIGTERM: each running rank reads this when the signal arrives, whichever of the
  // signals to its process group it takes first, and records its run as FAILED rather than KILLED
  // (core/teardown_reason.h). A rank that already exited is skipped (SIGPIPE is ignored while
  // signals_ lives, so writing to its pipe would only fail with EPIPE).
  void tell_ranks(const teardown::RankFailure& failure) {
    for (auto& slot : slots_) {
      if (slot->running) teardown::send(slot->proc.teardown_fd, failure);
    }
  }

  void kill_all(int sig) {
    signal_all(sig);
    killed_ = true;
  }

  void signal_all(int sig) {
    for (auto& slot : slots_) ::kill(-slot->proc.pid, sig);
  }

  void reap(Slot& slot) {
    int status = 0;
    while (::waitpid(slot.proc.pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (slot.running) {  // exited after the loop ended (only when start() failed part-way)
      slot.running = false;
      slot.report.exit =
          decode_child_status(WIFSIGNALED(status) ? CLD_KILLED : CLD_EXITED,
                              WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
      slot.report.end_seconds = clock_.seconds();
    }
  }

  JobOutcome outcome() const {
    JobOutcome out;
    out.seconds = clock_.seconds();
    for (const auto& slot : slots_) {
      RankReport report = slot->report;
      report.rank = slot->spec.rank;
      report.host = slot->spec.host;
      report.pid = slot->proc.pid;
      out.ranks.push_back(std::move(report));
    }
    if (interrupt_signal_ != 0) {
      out.cause = JobOutcome::Cause::kInterrupted;
      out.interrupt_signal = interrupt_signal_;
      out.peer_failed = failure_elsewhere_.has_value();
      out.exit_code = 128 + interrupt_signal_;
    } else if (failed_rank_ >= 0) {
      out.cause = JobOutcome::Cause::kRankFailed;
      out.failed_rank = failed_rank_;
      for (const RankReport& r : out.ranks) {
        if (r.rank == failed_rank_) out.exit_code = shell_exit_code(r.exit);
      }
    }
    return out;
  }

  bool any_running() const {
    for (const auto& slot : slots_) {
      if (slot->running) return true;
    }
    return false;
  }

  bool any_pipe_open() const {
    for (const auto& slot : slots_) {
      if (slot->proc.stdout_fd >= 0 || slot->proc.stderr_fd >= 0) return true;
    }
    return false;
  }

  static void close_fd(int& fd) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }

  SupervisorOptions options_;
  GroupGuard guard_;  // forked before the signal handlers exist, so it never runs them
  SignalPipe signals_;
  Stopwatch clock_;
  std::vector<std::unique_ptr<Slot>> slots_;
  bool tearing_down_ = false;
  bool killed_ = false;
  double kill_at_ = 0;
  int failed_rank_ = -1;
  int interrupt_signal_ = 0;
  std::optional<teardown::RankFailure> failure_elsewhere_;  // an interrupt's failure_elsewhere()
};

}  // namespace

double silence_limit_from_env() {
  const char* text = std::getenv("DSTRAIN_COMM_TIMEOUT");
  if (text == nullptr || *text == '\0') return 300.0;
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(seconds > 0) || seconds > 1e9) {
    fail(ErrorKind::kUsage,
         "environment variable DSTRAIN_COMM_TIMEOUT='{}' is not a positive "
         "number of seconds",
         text);
  }
  return seconds;
}

std::string describe(const RankReport& report) {
  if (report.silent_seconds <= 0) return describe(report.exit);
  return fmt::format(
      "stopped responding (no heartbeat for {:.1f} s: its process was stopped or frozen); killed "
      "by the launcher",
      report.silent_seconds);
}

JobOutcome run_local_job(const std::vector<RankSpec>& ranks, const SupervisorOptions& options) {
  LocalJob job(options);
  return job.run(ranks);
}

std::string local_hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

}  // namespace dstrain::launcher
