#include "launcher/slurm_step.h"

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <csignal>
#include <regex>

#include <fmt/format.h>

#include "core/error.h"
#include "core/secrets.h"
#include "core/timer.h"
#include "launcher/exit_status.h"
#include "launcher/hostlist.h"
#include "launcher/output.h"
#include "launcher/program_path.h"
#include "launcher/signals.h"
#include "launcher/spawn_local.h"
#include "launcher/text_util.h"

namespace dstrain::launcher {
namespace {

constexpr int kPollMillis = 100;
constexpr double kAfterGraceSeconds = 10;  // how long srun may take beyond the grace to end a step
constexpr double kStepGoneSeconds = 10;    // how long a cancelled step may stay in squeue
constexpr double kSlurmQuerySeconds = 10;  // squeue, sinfo, scancel
constexpr double kDrainSeconds = 2;        // reading srun's pipes after it exited

// A child's exit code (128 + signal), or -1 while it runs.
int reap(pid_t pid, bool block) {
  siginfo_t info{};
  int flags = WEXITED | (block ? 0 : WNOHANG);
  while (::waitid(P_PID, static_cast<id_t>(pid), &info, flags) != 0) {
    if (errno != EINTR) return 255;
  }
  if (info.si_pid == 0) return -1;
  return shell_exit_code(decode_child_status(info.si_code, info.si_status));
}

// Reads what is there; closes and marks the descriptor -1 at end of file.
void read_some(int& fd, std::string* into) {
  char buf[4096];
  while (fd >= 0) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      into->append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    ::close(fd);
    fd = -1;
  }
}

struct CommandResult {
  int exit_code = -1;
  bool timed_out = false;
  std::string output;  // stdout, then stderr
};

// Runs `commands` in parallel (each in its own process group, killed if the launcher dies) bounded
// by `timeout_s`: one still running then is killed with its group and reaped. A command has ended
// when its process has exited, not when its output closes: srun closes its output when the step's
// tasks end and exits only after it has told the controller (seconds on a busy cluster). What a
// command wrote before it exited is read; a child that outlives it and keeps its output open is
// not waited for.
std::vector<CommandResult> run_commands(const std::vector<std::vector<std::string>>& commands,
                                        double timeout_s) {
  struct Running {
    LocalProcess proc;
    std::string out, err;
    int exit_code = -1;  // -1 while the process runs
  };
  std::vector<Running> runs;
  for (const auto& argv : commands) {
    RankSpec spec;
    spec.argv = argv;
    runs.push_back(Running{spawn_local(spec), "", "", -1});
  }
  Stopwatch clock;
  auto read_all = [&] {
    for (Running& r : runs) {
      read_some(r.proc.stdout_fd, &r.out);
      read_some(r.proc.stderr_fd, &r.err);
    }
  };
  auto any_running = [&] {
    bool running = false;
    for (Running& r : runs) {
      if (r.exit_code < 0) r.exit_code = reap(r.proc.pid, false);
      running = running || r.exit_code < 0;
    }
    return running;
  };
  while (any_running() && clock.seconds() < timeout_s) {
    std::vector<pollfd> fds;
    for (const Running& r : runs) {
      for (int fd : {r.proc.stdout_fd, r.proc.stderr_fd})
        if (fd >= 0) fds.push_back(pollfd{fd, POLLIN, 0});
    }
    ::poll(fds.data(), fds.size(), kPollMillis);  // no descriptor left: a sleep
    read_all();
  }
  read_all();
  std::vector<CommandResult> results;
  for (Running& r : runs) {
    CommandResult result;
    result.exit_code = r.exit_code;
    if (result.exit_code < 0) {
      result.timed_out = true;
      ::kill(-r.proc.pid, SIGKILL);
      reap(r.proc.pid, true);
    }
    for (int fd : {r.proc.stdout_fd, r.proc.stderr_fd})
      if (fd >= 0) ::close(fd);
    result.output = r.out + r.err;
    results.push_back(std::move(result));
  }
  return results;
}

CommandResult run_command(const std::vector<std::string>& argv, double timeout_s) {
  return run_commands({argv}, timeout_s).front();
}

std::string one_line(std::string text) {
  std::replace(text.begin(), text.end(), '\n', ' ');
  while (!text.empty() && text.back() == ' ') text.pop_back();
  return text;
}

// The ids ("123.4") of the steps of `job_id` named `name` that squeue still lists.
std::vector<std::string> listed_steps(const std::string& job_id, const std::string& name) {
  CommandResult r = run_command(
      {resolve_program("squeue"), "-h", "-s", "-j", job_id, "-o", "%i %j"}, kSlurmQuerySeconds);
  std::vector<std::string> ids;
  for (const std::string& line : split(r.output, '\n')) {
    const std::vector<std::string> words = split_words(line);
    if (words.size() == 2 && words[1] == name) ids.push_back(words[0]);
  }
  return ids;
}

// Cancels what squeue still lists of the step (once), then waits up to kStepGoneSeconds for it to
// leave; names it on stderr if it does not.
void wait_step_gone(const SrunStep& step, bool cancel) {
  std::vector<std::string> ids = listed_steps(step.job_id, step.name);
  if (cancel && !ids.empty()) {
    std::vector<std::string> argv = {resolve_program("scancel"), "--signal=KILL"};
    argv.insert(argv.end(), ids.begin(), ids.end());
    run_command(argv, kSlurmQuerySeconds);
  }
  Stopwatch clock;
  while (!ids.empty() && clock.seconds() < kStepGoneSeconds) {
    ::usleep(200 * 1000);
    ids = listed_steps(step.job_id, step.name);
  }
  for (const std::string& id : ids) {
    write_all(2, fmt::format("dstrain launch: Slurm still lists step {} after {} s; it waits for a "
                             "node that does not answer (Slurm ends it when it declares the node "
                             "down); going on\n",
                             id, kStepGoneSeconds));
  }
}

class SrunStepRun {
 public:
  explicit SrunStepRun(const SrunStep& step) : step_(step) {}

  AttemptOutcome run() {
    RankSpec spec;
    spec.argv = step_.argv;
    proc_ = spawn_local(spec);
    bool killed = supervise();
    out_lines_.finish([](std::string_view line) { relay(1, line); });
    err_lines_.finish([this](std::string_view line) { on_stderr(line); });
    if (exit_code_ != 0 || interrupt_signal_ != 0) wait_step_gone(step_, killed);
    return outcome();
  }

 private:
  // Relays srun's output until it exits; true when it had to be killed.
  bool supervise() {
    double give_up_at = 0;
    while (proc_.stdout_fd >= 0 || proc_.stderr_fd >= 0 || exit_code_ < 0) {
      pollfd fds[3] = {
          {signals_.fd(), POLLIN, 0}, {proc_.stdout_fd, POLLIN, 0}, {proc_.stderr_fd, POLLIN, 0}};
      ::poll(fds, 3, kPollMillis);
      pump();
      handle_signals();
      if (exit_code_ < 0) exit_code_ = reap(proc_.pid, false);
      if ((failed_node_ >= 0 || interrupt_signal_ != 0) && give_up_at == 0)
        give_up_at = clock_.seconds() + step_.grace_seconds + kAfterGraceSeconds;
      if (give_up_at > 0 && clock_.seconds() > give_up_at && exit_code_ < 0) {
        write_all(2, fmt::format("dstrain launch: srun did not end the step within {:g} s; killing "
                                 "it and cancelling the step\n",
                                 step_.grace_seconds + kAfterGraceSeconds));
        ::kill(-proc_.pid, SIGKILL);
        reap(proc_.pid, true);
        exit_code_ = interrupt_signal_ != 0 ? 128 + interrupt_signal_ : root_cause_code(1);
        close_pipes();
        return true;
      }
      if (exit_code_ >= 0 && exited_at_ == 0) exited_at_ = clock_.seconds();
      // A leftover holder of srun's pipes must not keep the launcher waiting.
      if (exited_at_ > 0 && clock_.seconds() > exited_at_ + kDrainSeconds) close_pipes();
    }
    return false;
  }

  void pump() {
    std::string out, err;
    read_some(proc_.stdout_fd, &out);
    read_some(proc_.stderr_fd, &err);
    out_lines_.feed(out, [](std::string_view line) { relay(1, line); });
    err_lines_.feed(err, [this](std::string_view line) { on_stderr(line); });
  }

  void close_pipes() {
    for (int* fd : {&proc_.stdout_fd, &proc_.stderr_fd}) {
      if (*fd >= 0) ::close(*fd);
      *fd = -1;
    }
  }

  void handle_signals() {
    for (const ReceivedSignal& received : signals_.drain()) {
      if (received.number == SIGCHLD) continue;
      if (received.number == SIGUSR1) {
        ::kill(proc_.pid, SIGUSR1);
        continue;
      }
      if (interrupt_signal_ == 0) interrupt_signal_ = received.number;
      ::kill(proc_.pid, SIGTERM);
    }
  }

  static void relay(int fd, std::string_view line) { write_all(fd, secrets::redact(line) + "\n"); }

  // srun's own error lines: the first failed task, or a node failure, is the root cause.
  void on_stderr(std::string_view line) {
    relay(2, line);
    static const std::regex task(R"(^srun: error: (\S+): tasks? ([0-9]+)(-[0-9]+)?: (.*)$)");
    static const std::regex node(R"(^srun: error: Node failure on (\S+))");
    static const std::regex launch(R"(^srun: error: .* failed on node (\S+): (.*)$)");
    const std::string text(line);
    std::smatch m;
    if (text.rfind("srun: ", 0) == 0) last_srun_line_ = text;
    if (failed_node_ >= 0 || interrupt_signal_ != 0) return;
    if (std::regex_search(text, m, task)) {
      failed_node_ = std::stoi(m[2]);
      failed_host_ = m[1];
      cause_ = m[4];
    } else if (std::regex_search(text, m, node)) {
      name_failed_node(m[1], "Slurm declared the node failed");
    } else if (std::regex_search(text, m, launch)) {
      name_failed_node(m[1], "srun could not start the agent there: " + std::string(m[2]));
    }
  }

  void name_failed_node(const std::string& host, const std::string& cause) {
    const auto it = std::find(step_.nodes.begin(), step_.nodes.end(), host);
    if (it == step_.nodes.end()) return;
    failed_node_ = static_cast<int>(it - step_.nodes.begin());
    failed_host_ = host;
    cause_ = cause;
  }

  // The root cause's exit code when srun named it ("Exited with exit code 3"), else `otherwise`:
  // srun's own code is the largest of its tasks', often a node stopped by the teardown (143).
  int root_cause_code(int otherwise) const {
    static const std::regex code(R"(exit code ([0-9]+))");
    std::smatch m;
    return std::regex_search(cause_, m, code) ? std::stoi(m[1]) : otherwise;
  }

  AttemptOutcome outcome() const {
    AttemptOutcome o;
    o.exit_code = exit_code_;
    if (interrupt_signal_ != 0) {
      o.kind = AttemptOutcome::Kind::kInterrupted;
      o.exit_code = 128 + interrupt_signal_;
    } else if (exit_code_ != 0) {
      o.kind = AttemptOutcome::Kind::kFailed;
      o.exit_code = root_cause_code(exit_code_);
      o.host = failed_host_;
      if (failed_node_ >= 0) {
        const int first = failed_node_ * step_.nproc;
        o.cause = fmt::format("node {} (ranks {}-{}): {}", failed_node_, first,
                              first + step_.nproc - 1, cause_);
      } else {
        o.cause = fmt::format("srun exited with code {}{}", exit_code_,
                              last_srun_line_.empty() ? "" : ": " + last_srun_line_);
      }
    }
    return o;
  }

  SrunStep step_;
  SignalPipe signals_;
  Stopwatch clock_;
  LocalProcess proc_;
  LineSplitter out_lines_, err_lines_;
  int exit_code_ = -1;
  double exited_at_ = 0;
  int interrupt_signal_ = 0;
  int failed_node_ = -1;
  std::string failed_host_, cause_, last_srun_line_;
};

// "down*", "drain", "drng", "fail", "maint", ... : the short states in which a node runs no new
// step (sinfo %t; a trailing '*' means not responding).
bool state_refuses_steps(const std::string& state) {
  if (!state.empty() && state.back() == '*') return true;
  for (const char* bad : {"down", "drain", "drng", "fail", "maint", "boot", "pow", "unk"})
    if (state.rfind(bad, 0) == 0) return true;
  return false;
}

}  // namespace

AttemptOutcome run_srun_step(const SrunStep& step) {
  SrunStepRun run(step);
  return run.run();
}

std::vector<NodeCheck> check_slurm_nodes(const std::string& job_id,
                                         const std::vector<std::string>& nodes, double timeout_s) {
  std::vector<std::vector<std::string>> commands = {
      {resolve_program("squeue"), "-h", "-j", job_id, "-o", "%N"},
      {resolve_program("sinfo"), "-h", "-N", "-o", "%N %t"}};
  for (const std::string& node : nodes) {
    commands.push_back({resolve_program("srun"), "--overlap", "--quiet", "-w", node, "-N1", "-n1",
                        "--job-name=dstrain-probe", "true"});
  }
  const std::vector<CommandResult> r = run_commands(commands, timeout_s);
  const std::vector<std::string> in_job =
      r[0].exit_code == 0 ? expand_hostlist(one_line(r[0].output)) : std::vector<std::string>{};
  std::vector<NodeCheck> checks;
  for (size_t k = 0; k < nodes.size(); ++k) {
    NodeCheck c{nodes[k], true, ""};
    std::string state;
    for (const std::string& line : split(r[1].output, '\n')) {
      const std::vector<std::string> words = split_words(line);
      if (words.size() == 2 && words[0] == nodes[k]) state = words[1];
    }
    const CommandResult& probe = r[2 + k];
    if (r[0].exit_code == 0 && std::find(in_job.begin(), in_job.end(), nodes[k]) == in_job.end()) {
      c = {nodes[k], false, "no longer in the job's node list (Slurm removed it)"};
    } else if (state_refuses_steps(state)) {
      c = {nodes[k], false, "its state is " + state};
    } else if (probe.exit_code != 0) {
      c = {nodes[k], false,
           probe.timed_out ? fmt::format("a probe step (srun -w {} true) did not end within {:g} s",
                                         nodes[k], timeout_s)
                           : fmt::format("a probe step (srun -w {} true) failed: {}", nodes[k],
                                         one_line(probe.output))};
    }
    checks.push_back(c);
  }
  return checks;
}

}  // namespace dstrain::launcher
