#include "launcher/ssh_job.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <mutex>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "core/error.h"
#include "core/secrets.h"
#include "core/timer.h"
#include "launcher/exit_status.h"
#include "launcher/node_agent.h"
#include "launcher/output.h"
#include "launcher/shell_quote.h"
#include "launcher/signals.h"
#include "launcher/stdin_env.h"

namespace dstrain::launcher {
namespace {

constexpr int kReadMillis = 100;
constexpr double kAfterGraceSeconds = 10;  // how long a stopped agent may take beyond the grace
constexpr size_t kReportLines = 40;

// Output of a short remote command on one line.
std::string strip_newlines(std::string text) {
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  while (!text.empty() && text.back() == ' ') text.pop_back();
  return text;
}

// What one host's thread shares with the main thread.
struct AgentRun {
  int node = 0;
  std::string host;
  SshTarget target;
  std::string command;
  std::string stdin_env;  // the secret variables, written first on the agent's stdin
  int first_rank = 0, last_rank = 0;
  // main → thread
  std::atomic<bool> stop{false};
  std::string stop_line;  // written once, before `stop`: what to tell the agent (node_agent.h)
  std::atomic<int> usr1{0};
  // thread → main (read after `done`)
  std::atomic<bool> done{false};
  int exit_code = -1;  // the agent's exit status; -1 none
  std::string error;   // SSH failure
  double end_seconds = 0;
  bool stopped_by_launcher = false;
  TailBuffer report{kReportLines};
};

// How a failed node ended, for the outcome and for the other nodes' ranks.
std::string node_failure(const AgentRun& r) {
  return fmt::format("node {} (ranks {}-{}): {}", r.node, r.first_rank, r.last_rank,
                     r.error.empty() ? fmt::format("exit code {}", r.exit_code) : r.error);
}

class SshJob {
 public:
  SshJob(const MultiNodePlan& plan, const SshSettings& ssh, double grace)
      : ssh_(ssh), grace_(grace) {
    for (size_t k = 0; k < plan.nodes.size(); ++k) {
      auto run = std::make_unique<AgentRun>();
      const HostEntry& h = plan.nodes[k].entry;
      run->node = static_cast<int>(k);
      run->host = h.host;
      run->target = SshTarget{h.host, h.user, h.ssh_port};
      run->command = plan.agent_commands[k];
      run->stdin_env = encode_stdin_env(plan.secret_env);
      std::vector<RankSpec> ranks = ranks_on_node(plan.world, run->node);
      run->first_rank = ranks.front().rank;
      run->last_rank = ranks.back().rank;
      runs_.push_back(std::move(run));
    }
  }

  AttemptOutcome run() {
    for (auto& r : runs_) threads_.emplace_back([this, run = r.get()] { agent_thread(*run); });
    supervise();
    for (std::thread& t : threads_) t.join();
    write_all(2, secrets::redact(summarize()));
    return outcome();
  }

 private:
  void supervise() {
    double give_up_at = 0;
    while (!all_done()) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait_for(lock, std::chrono::milliseconds(kReadMillis));
      }
      handle_signals();
      find_failure();
      if (stopping_ && give_up_at == 0) give_up_at = clock_.seconds() + grace_ + kAfterGraceSeconds;
      if (give_up_at > 0 && clock_.seconds() > give_up_at)
        break;  // threads end on their own deadline
    }
  }

  void handle_signals() {
    for (const ReceivedSignal& received : signals_.drain()) {
      const int sig = received.number;
      if (sig == SIGCHLD) continue;
      if (sig == SIGUSR1) {
        for (auto& r : runs_) r->usr1++;
        continue;
      }
      if (!stopping_) {
        interrupt_signal_ = sig;
        exit_code_ = 128 + sig;
      }
      stop_all(std::nullopt);
    }
  }

  void find_failure() {
    for (auto& r : runs_) {
      if (!r->done || stopping_) continue;
      if (!r->error.empty() || r->exit_code != 0) {
        failed_node_ = r->node;
        exit_code_ = r->error.empty() && r->exit_code > 0 ? r->exit_code : kSshFailureExit;
        stop_all(failure_of(*r));
      }
    }
  }

  // What the agents tell their ranks when node `r` failed: the rank is known only when the node
  // held one; its agent's summary names it.
  static teardown::RankFailure failure_of(const AgentRun& r) {
    return {r.first_rank == r.last_rank ? r.first_rank : -1, r.host, node_failure(r)};
  }

  // Stops every agent; `failure`: the failed rank that is why, which the agents tell their ranks.
  // What an agent is told is decided by the first call.
  void stop_all(const std::optional<teardown::RankFailure>& failure) {
    if (!stopping_) {
      for (auto& r : runs_) {
        r->stopped_by_launcher = !r->done;
        r->stop_line = failure ? agent_stop_line_for(*failure) : std::string(kAgentStopLine);
      }
    }
    stopping_ = true;
    for (auto& r : runs_) r->stop = true;
  }

  bool all_done() const {
    for (const auto& r : runs_) {
      if (!r->done) return false;
    }
    return true;
  }

  void agent_thread(AgentRun& run) {
    try {
      talk_to_agent(run);
    } catch (const Error& e) {
      run.error = e.what();
    }
    run.end_seconds = clock_.seconds();
    run.done = true;
    changed_.notify_all();
  }

  void talk_to_agent(AgentRun& run) {
    if (run.stop) return;
    SshSession session(run.target, ssh_);
    session.exec(run.command);
    session.write_stdin(run.stdin_env);
    LineSplitter out_lines, err_lines;
    double deadline = 0;
    int usr1_sent = 0;
    std::string out, err;
    // Keepalive (node_agent.h): a ping down the channel every interval; the agent's lines (its
    // alive line at least) coming back. Silence for keepalive_seconds means the host is lost.
    double last_heard = clock_.seconds();
    double next_ping = 0;
    while (true) {
      if (run.stop && deadline == 0) {
        session.write_stdin(run.stop_line + "\n");
        session.send_eof();
        deadline = clock_.seconds() + grace_ + kAfterGraceSeconds;
      }
      for (; usr1_sent < run.usr1; ++usr1_sent)
        session.write_stdin(std::string(kAgentUsr1Line) + "\n");
      if (deadline == 0 && clock_.seconds() >= next_ping) {
        session.write_stdin(std::string(kAgentPingLine) + "\n");
        next_ping = clock_.seconds() + keepalive_send_interval(ssh_.keepalive_seconds);
      }
      bool open = session.read(&out, &err, kReadMillis);
      if (!out.empty() || !err.empty()) last_heard = clock_.seconds();
      relay(run, out_lines, out, 1);
      relay(run, err_lines, err, 2);
      if (!open) break;
      if (deadline > 0 && clock_.seconds() > deadline) {
        run.error = "the agent did not stop in time; the connection was closed";
        return;
      }
      if (clock_.seconds() - last_heard > ssh_.keepalive_seconds) {
        fail(ErrorKind::kComm,
             "ssh {}: host lost: nothing from it for {} s (--ssh-keepalive): its link or the host "
             "is down, or it stopped answering",
             describe_target(run.target), ssh_.keepalive_seconds);
      }
    }
    auto emit = [&](int fd) {
      return [&, fd](std::string_view line) { emit_line(run, line, fd); };
    };
    out_lines.finish(emit(1));
    err_lines.finish(emit(2));
    run.exit_code = session.exit_status();
    if (run.exit_code < 0)
      run.error = "the agent ended without an exit status (killed by a signal?)";
  }

  void relay(AgentRun& run, LineSplitter& lines, std::string& bytes, int fd) {
    lines.feed(bytes, [&](std::string_view line) { emit_line(run, line, fd); });
    bytes.clear();
  }

  // Rank lines carry the agent's "[host:rank] " prefix already; other lines get "[host] ". The
  // agent's keepalive lines are dropped.
  void emit_line(AgentRun& run, std::string_view line, int fd) {
    if (fd == 1 && line == kAgentAliveLine) return;
    std::string rank_prefix = "[" + run.host + ":";
    bool rank_line = line.substr(0, rank_prefix.size()) == rank_prefix;
    const std::string shown = secrets::redact(line);
    std::string text = rank_line ? shown : "[" + run.host + "] " + shown;
    text += '\n';
    std::lock_guard<std::mutex> lock(output_mutex_);
    if (!rank_line && fd == 2) run.report.push(shown);
    write_all(fd, text);
  }

  AttemptOutcome outcome() const {
    AttemptOutcome o;
    o.exit_code = exit_code_;
    if (interrupt_signal_ != 0) {
      o.kind = AttemptOutcome::Kind::kInterrupted;
    } else if (failed_node_ >= 0) {
      const AgentRun& r = *runs_[failed_node_];
      o.kind = AttemptOutcome::Kind::kFailed;
      o.host = r.host;
      o.cause = node_failure(r);
    }
    return o;
  }

  std::string node_state(const AgentRun& r) const {
    std::string state = !r.error.empty()  ? r.error
                        : r.exit_code < 0 ? "did not finish"
                                          : fmt::format("exit code {}", r.exit_code);
    if (r.node == failed_node_) return state + "  <- root cause";
    if (r.stopped_by_launcher) return state + "  (stopped by the launcher)";
    return state;
  }

  std::string summarize() const {
    std::string out;
    if (failed_node_ < 0 && interrupt_signal_ == 0) {
      return fmt::format("dstrain launch: all {} node(s) exited 0 after {:.1f} s\n", runs_.size(),
                         clock_.seconds());
    }
    if (interrupt_signal_ != 0) {
      out +=
          fmt::format("dstrain launch: interrupted by {} after {:.1f} s; all nodes were stopped\n",
                      signal_name(interrupt_signal_), clock_.seconds());
    } else {
      const AgentRun& r = *runs_[failed_node_];
      out += fmt::format(
          "dstrain launch: node {} (host {}, ranks {}-{}) failed first after {:.1f} s: {}\n",
          r.node, r.host, r.first_rank, r.last_rank, r.end_seconds,
          r.error.empty() ? fmt::format("exit code {}", r.exit_code) : r.error);
      std::vector<std::string> report = r.report.lines();
      if (!report.empty()) out += fmt::format("  what host {} reported:\n", r.host);
      for (const std::string& line : report) out += "    | " + line + "\n";
    }
    out += "  nodes:\n";
    for (const auto& r : runs_) {
      out += fmt::format("    node {:<3} {:<20} ranks {}-{}  {}\n", r->node, r->host, r->first_rank,
                         r->last_rank, node_state(*r));
    }
    out += fmt::format("dstrain launch: exit code {}\n", exit_code_);
    return out;
  }

  SshSettings ssh_;
  double grace_;
  SignalPipe signals_;
  Stopwatch clock_;
  std::vector<std::unique_ptr<AgentRun>> runs_;
  std::vector<std::thread> threads_;
  std::mutex mutex_, output_mutex_;
  std::condition_variable changed_;
  bool stopping_ = false;
  int failed_node_ = -1;
  int interrupt_signal_ = 0;
  int exit_code_ = 0;
};

}  // namespace

AttemptOutcome run_ssh_job(const MultiNodePlan& plan, const SshSettings& ssh,
                           double grace_seconds) {
  SshJob job(plan, ssh, grace_seconds);
  return job.run();
}

std::vector<HostCheck> probe_hosts(const MultiNodePlan& plan, const SshSettings& ssh,
                                   const std::string& binary, bool devices) {
  std::vector<HostCheck> checks(plan.nodes.size());
  std::vector<std::thread> threads;
  for (size_t k = 0; k < plan.nodes.size(); ++k) {
    threads.emplace_back([&, k] {
      const HostEntry& h = plan.nodes[k].entry;
      SshTarget target{h.host, h.user, h.ssh_port};
      HostCheck& c = checks[k];
      c.host = h.host;
      try {
        SshSession session(target, ssh);
        c.reachable = true;
        std::string command = shell_quote(binary) + " version";
        if (devices) {
          // The worker, LibTorch and the GPUs as the node's ranks would see them.
          std::string visible;
          for (int d : plan.nodes[k].slots)
            visible += (visible.empty() ? "" : ",") + std::to_string(d);
          command += " && CUDA_VISIBLE_DEVICES=" + visible + " " + shell_quote(binary) +
                     " debug devices --ranks " + std::to_string(plan.nodes[k].slots.size());
        }
        session.exec(command);
        std::string out, err;
        while (session.read(&out, &err, kReadMillis)) {
        }
        int code = session.exit_status();
        std::string lines = code == 0 ? out : (err.empty() ? out : err);
        while (!lines.empty() && lines.back() == '\n') lines.pop_back();
        for (size_t at = lines.find('\n'); at != std::string::npos; at = lines.find('\n', at)) {
          lines.replace(at, 1, "; ");
        }
        const std::string text = strip_newlines(lines);
        c.ok = code == 0;
        c.text = code == 0 ? text : fmt::format("'{}' failed ({}): {}", command, code, text);
      } catch (const Error& e) {
        c.text = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return checks;
}

int check_hosts(const MultiNodePlan& plan, const SshSettings& ssh, const std::string& binary) {
  bool all_ok = true;
  for (const HostCheck& c : probe_hosts(plan, ssh, binary, /*devices=*/true)) {
    write_all(1, c.reachable ? fmt::format("check {}: reachable; {}\n", c.host, c.text)
                             : fmt::format("check {}: UNREACHABLE: {}\n", c.host, c.text));
    all_ok = all_ok && c.ok;
  }
  return all_ok ? 0 : kSshFailureExit;
}

}  // namespace dstrain::launcher
