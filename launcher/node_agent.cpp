#include "launcher/node_agent.h"

#include <poll.h>
#include <unistd.h>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "core/error.h"
#include "core/fs.h"
#include "core/secrets.h"
#include "core/timer.h"
#include "launcher/output.h"
#include "launcher/stdin_env.h"
#include "launcher/supervisor.h"
#include "launcher/text_util.h"

namespace dstrain::launcher {
namespace {

// The root writes the block right after starting the agent; this only bounds a root that died.
constexpr double kStdinEnvSeconds = 30;

// What the root launcher's stop line said failed, for the supervisor's failure_elsewhere: the
// stdin thread sets it before it signals this process, the supervisor reads it once the signal
// arrived.
class FailureElsewhere {
 public:
  void set(teardown::RankFailure failure) {
    std::lock_guard<std::mutex> lock(mutex_);
    failure_ = std::move(failure);
  }
  std::optional<teardown::RankFailure> get() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return failure_;
  }

 private:
  mutable std::mutex mutex_;
  std::optional<teardown::RankFailure> failure_;
};

// Turns stdin control lines into signals to this process (handled by the supervisor's signal
// pipe); end of file, an error, or `keepalive_seconds` (> 0) without a byte means SIGTERM. Unknown
// lines (kAgentPingLine among them) are ignored. After a stop line the thread ends: the launcher
// closes the channel right after it, and that end of file must not count as a second interrupt
// (which would skip the ranks' grace period). The thread is detached: a job that ends first simply
// exits under it.
void watch_stdin(double keepalive_seconds, std::shared_ptr<FailureElsewhere> elsewhere) {
  std::thread([keepalive_seconds, elsewhere] {
    LineSplitter lines(1024);  // a stop line that names a failed rank is at most ~550 bytes
    bool stopped = false;
    auto on_line = [&stopped, &elsewhere](std::string_view line) {
      if (stopped) return;
      if (line == kAgentUsr1Line) ::kill(::getpid(), SIGUSR1);
      std::optional<teardown::RankFailure> failure = failure_of_agent_stop_line(line);
      if (failure) elsewhere->set(std::move(*failure));  // before the signal that makes it count
      if (failure || line == kAgentStopLine) {
        ::kill(::getpid(), SIGTERM);
        stopped = true;
      }
    };
    int timeout_ms = keepalive_seconds > 0 ? static_cast<int>(keepalive_seconds * 1000) : -1;
    char buf[256];
    while (true) {
      pollfd in{0, POLLIN, 0};
      int ready = ::poll(&in, 1, timeout_ms);
      if (ready < 0 && errno == EINTR) continue;
      if (ready == 0) {
        write_all(2, fmt::format("dstrain launch: nothing from the launcher for {} s (keepalive); "
                                 "the link is lost: stopping this node's ranks\n",
                                 keepalive_seconds));
        break;
      }
      ssize_t n = ready < 0 ? -1 : ::read(0, buf, sizeof(buf));
      if (n == 0 || (n < 0 && errno != EINTR)) break;
      if (n > 0) lines.feed(std::string_view(buf, static_cast<size_t>(n)), on_line);
      if (stopped) return;
    }
    ::kill(::getpid(), SIGTERM);
  }).detach();
}

// The supervisor's tick: kAgentAliveLine on stdout every keepalive_send_interval().
std::function<void()> alive_writer(double keepalive_seconds) {
  double interval = keepalive_send_interval(keepalive_seconds);
  auto clock = std::make_shared<Stopwatch>();
  auto next = std::make_shared<double>(0);
  return [=] {
    if (clock->seconds() < *next) return;
    *next = clock->seconds() + interval;
    write_all(1, std::string(kAgentAliveLine) + "\n");
  };
}

// Writes kAgentAliveLine every keepalive_send_interval() until destroyed: staging a large model can
// take longer than the keepalive, and nothing else is written to stdout meanwhile.
class AliveWhileStaging {
 public:
  explicit AliveWhileStaging(double keepalive_seconds) {
    if (keepalive_seconds <= 0) return;
    const auto interval = std::chrono::duration<double>(keepalive_send_interval(keepalive_seconds));
    thread_ = std::thread([this, interval] {
      std::unique_lock<std::mutex> lock(mutex_);
      while (!done_) {
        write_all(1, std::string(kAgentAliveLine) + "\n");
        wake_.wait_for(lock, interval, [this] { return done_; });
      }
    });
  }
  ~AliveWhileStaging() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  AliveWhileStaging(const AliveWhileStaging&) = delete;
  AliveWhileStaging& operator=(const AliveWhileStaging&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable wake_;
  bool done_ = false;
  std::thread thread_;
};

void check_agent(const AgentOptions& o) {
  if (o.nodes_nproc.empty()) fail(ErrorKind::kUsage, "--nodes-nproc is required with --node-rank");
  if (o.node_rank < 0 || o.node_rank >= static_cast<int>(o.nodes_nproc.size())) {
    fail(ErrorKind::kUsage, "--node-rank {} is outside 0..{}", o.node_rank,
         o.nodes_nproc.size() - 1);
  }
  if (o.launch.master_port == 0) fail(ErrorKind::kUsage, "--node-rank needs --master-port");
}

}  // namespace

std::string agent_stop_line_for(const teardown::RankFailure& failure) {
  return std::string(kAgentStopForFailedRankLine) + ' ' + teardown::encode(failure);
}

std::optional<teardown::RankFailure> failure_of_agent_stop_line(std::string_view line) {
  const std::string_view tag = kAgentStopForFailedRankLine;
  if (line.substr(0, tag.size()) != tag) return std::nullopt;
  if (line.size() == tag.size()) return teardown::RankFailure{};
  if (line[tag.size()] != ' ') return std::nullopt;
  return teardown::decode(line.substr(tag.size() + 1)).value_or(teardown::RankFailure{});
}

double keepalive_send_interval(double keepalive_seconds) {
  return keepalive_seconds / 4;
}

std::vector<int> parse_int_list(const std::string& text, const char* flag, int min_value) {
  std::vector<int> out;
  if (text.empty()) return out;
  for (const std::string& piece : split(text, ',')) {
    int value = 0;
    if (!parse_int(piece, &value) || value < min_value) {
      fail(ErrorKind::kUsage, "{} expects a comma-separated list of integers >= {}, got '{}'", flag,
           min_value, text);
    }
    out.push_back(value);
  }
  return out;
}

WorldPlan plan_node_agent(const AgentOptions& o) {
  check_agent(o);
  check_local_options(o.launch);
  PlanRequest request;
  for (size_t n = 0; n < o.nodes_nproc.size(); ++n) {
    NodeSpec node{"node" + std::to_string(n), o.nodes_nproc[n], {}};
    if (static_cast<int>(n) == o.node_rank) {
      node.host = o.host.empty() ? local_hostname() : o.host;
      node.devices = o.devices;
    }
    request.nodes.push_back(node);
  }
  request.master_addr = o.launch.master_addr;
  request.master_port = o.launch.master_port;
  request.command = rank_command(o.launch);
  return make_world_plan(request);
}

int run_node_agent(const AgentOptions& options) {
  // A SIGUSR1 that arrives before the ranks exist has nobody to checkpoint; it must not kill the
  // agent (the supervisor installs its own handler once the ranks start).
  std::signal(SIGUSR1, SIG_IGN);
  if (options.env_on_stdin) adopt_stdin_env(kStdinEnvSeconds);
  WorldPlan plan = plan_node_agent(options);
  std::vector<RankSpec> ranks = ranks_on_node(plan, options.node_rank);
  const std::string host = ranks.front().host;
  SupervisorOptions supervise;
  supervise.grace_seconds = options.launch.grace_seconds;
  supervise.silence_limit_seconds = silence_limit_from_env();
  supervise.log_dir = options.launch.log_dir;
  supervise.targets.host = host;
  if (!options.launch.log_dir.empty()) fs::create_dirs(options.launch.log_dir);
  auto elsewhere = std::make_shared<FailureElsewhere>();
  supervise.failure_elsewhere = [elsewhere] { return elsewhere->get(); };
  if (options.watch_stdin) {
    watch_stdin(options.keepalive_seconds, elsewhere);
    if (options.keepalive_seconds > 0) supervise.on_tick = alive_writer(options.keepalive_seconds);
  }
  {
    AliveWhileStaging alive(options.watch_stdin ? options.keepalive_seconds : 0);
    stage_node_inputs(options.launch, plan.world_size, host, ranks);
  }
  JobOutcome outcome = run_local_job(ranks, supervise);
  write_all(2, secrets::redact(format_summary(outcome, host)));
  return outcome.exit_code;
}

}  // namespace dstrain::launcher
