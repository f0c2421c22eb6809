#include "launcher/launch_record.h"

#include <unistd.h>
#include <algorithm>

#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "core/secrets.h"
#include "launcher/remote_env.h"

namespace dstrain::launcher {
namespace {

namespace stdfs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kFormat = "dstrain-launch";
constexpr int kVersion = 1;

std::string absolute_or_empty(const std::string& path) {
  return path.empty() ? path : stdfs::absolute(path).lexically_normal().string();
}

LaunchMode mode_from(const std::string& name, const std::string& path) {
  if (name == "local") return LaunchMode::kLocal;
  if (name == "ssh") return LaunchMode::kSsh;
  if (name == "slurm") return LaunchMode::kSlurm;
  fail(ErrorKind::kInput, "{}: 'mode' is '{}', expected local, ssh or slurm", path, name);
}

// Reads optional keys of one JSON object with their types checked, naming the file and key.
class Reader {
 public:
  Reader(const json& object, std::string path) : j_(object), path_(std::move(path)) {}

  template <typename T>
  void get(const char* key, T* out) const {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return;
    try {
      *out = it->get<T>();
    } catch (const json::exception&) {
      fail(ErrorKind::kInput, "{}: '{}' has the wrong type ({})", path_, key, it->type_name());
    }
  }
  Reader object(const char* key) const {
    static const json empty = json::object();
    auto it = j_.find(key);
    if (it == j_.end()) return Reader(empty, path_);
    if (!it->is_object()) fail(ErrorKind::kInput, "{}: '{}' is not an object", path_, key);
    return Reader(*it, path_);
  }

 private:
  const json& j_;
  std::string path_;
};

json ssh_json(const LaunchRecord& r) {
  return {{"hostfile", r.hostfile},
          {"include", r.selection.include},
          {"exclude", r.selection.exclude},
          {"num_nodes", r.selection.num_nodes},
          {"num_gpus", r.selection.num_gpus},
          {"remote_cwd", r.remote_cwd},
          {"key_file", r.ssh.key_file},
          {"known_hosts", r.ssh.known_hosts},
          {"accept_new_host_keys", r.ssh.accept_new_host_keys},
          {"connect_timeout", r.ssh.connect_timeout},
          {"keepalive", r.ssh.keepalive_seconds},
          {"env", r.env},
          {"env_not_recorded", r.env_not_recorded}};
}

void read_ssh(const Reader& s, LaunchRecord* r) {
  s.get("hostfile", &r->hostfile);
  s.get("include", &r->selection.include);
  s.get("exclude", &r->selection.exclude);
  s.get("num_nodes", &r->selection.num_nodes);
  s.get("num_gpus", &r->selection.num_gpus);
  s.get("remote_cwd", &r->remote_cwd);
  s.get("key_file", &r->ssh.key_file);
  s.get("known_hosts", &r->ssh.known_hosts);
  s.get("accept_new_host_keys", &r->ssh.accept_new_host_keys);
  s.get("connect_timeout", &r->ssh.connect_timeout);
  s.get("keepalive", &r->ssh.keepalive_seconds);
  s.get("env", &r->env);
  s.get("env_not_recorded", &r->env_not_recorded);
}

}  // namespace

const char* mode_name(LaunchMode mode) {
  switch (mode) {
    case LaunchMode::kLocal:
      return "local";
    case LaunchMode::kSsh:
      return "ssh";
    case LaunchMode::kSlurm:
      return "slurm";
  }
  return "local";
}

std::string launch_record_path(const std::string& checkpoint_dir) {
  return (stdfs::path(checkpoint_dir) / kLaunchRecordFile).string();
}

std::string to_json(const LaunchRecord& r) {
  json j = {{"format", kFormat},
            {"version", kVersion},
            {"mode", mode_name(r.mode)},
            {"cwd", r.cwd},
            {"world_size", r.world_size},
            {"nproc", r.nproc},
            {"hosts", r.hosts},
            {"master_addr", r.master_addr},
            {"master_port", r.master_port},
            {"secret_env", r.secret_env},
            {"environment", r.environment},
            {"log_dir", r.log_dir},
            {"stage_dir", r.stage_dir},
            {"grace", r.grace_seconds},
            {"max_restarts", r.restart.max_restarts},
            {"restart_backoff", r.restart.backoff_seconds},
            {"min_nodes", r.min_nodes},
            {"elastic_batch", r.allow_batch_change ? "allow-change" : "keep"}};
  if (r.mode == LaunchMode::kSsh) j["ssh"] = ssh_json(r);
  if (r.mode == LaunchMode::kSlurm)
    j["slurm"] = {{"job_id", r.slurm_job_id}, {"nodes", r.slurm_nodes}};
  return j.dump(2) + "\n";
}

LaunchRecord parse_launch_record(const std::string& text, const std::string& path) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail(ErrorKind::kInput, "{}: not valid JSON: {}", path, e.what());
  }
  if (!j.is_object() || j.value("format", std::string()) != kFormat) {
    fail(ErrorKind::kInput, "{}: not a dstrain launch record (expected \"format\": \"{}\")", path,
         kFormat);
  }
  const Reader top(j, path);
  int version = 0;
  top.get("version", &version);
  if (version < 1 || version > kVersion) {
    fail(ErrorKind::kInput, "{}: version {} is not one this dstrain reads (1..{})", path, version,
         kVersion);
  }
  LaunchRecord r;
  std::string mode = "local", batch = "keep";
  top.get("mode", &mode);
  r.mode = mode_from(mode, path);
  top.get("cwd", &r.cwd);
  top.get("world_size", &r.world_size);
  top.get("nproc", &r.nproc);
  top.get("hosts", &r.hosts);
  top.get("master_addr", &r.master_addr);
  top.get("master_port", &r.master_port);
  top.get("secret_env", &r.secret_env);
  top.get("environment", &r.environment);
  top.get("log_dir", &r.log_dir);
  top.get("stage_dir", &r.stage_dir);
  top.get("grace", &r.grace_seconds);
  top.get("max_restarts", &r.restart.max_restarts);
  top.get("restart_backoff", &r.restart.backoff_seconds);
  top.get("min_nodes", &r.min_nodes);
  top.get("elastic_batch", &batch);
  r.allow_batch_change = batch == "allow-change";
  read_ssh(top.object("ssh"), &r);
  const Reader slurm = top.object("slurm");
  slurm.get("job_id", &r.slurm_job_id);
  slurm.get("nodes", &r.slurm_nodes);
  if (r.mode == LaunchMode::kSsh && r.hostfile.empty())
    fail(ErrorKind::kInput, "{}: mode ssh without 'ssh.hostfile'", path);
  return r;
}

void write_launch_record(const std::string& checkpoint_dir, const LaunchRecord& record) {
  fs::create_dirs(checkpoint_dir);
  fs::write_file_atomic(launch_record_path(checkpoint_dir), to_json(record));
}

std::optional<LaunchRecord> read_launch_record(const std::string& checkpoint_dir) {
  const std::string path = launch_record_path(checkpoint_dir);
  std::error_code ec;
  if (!stdfs::exists(path, ec)) return std::nullopt;
  std::string text;
  try {
    text = fs::read_file(path);
  } catch (const Error& e) {
    throw Error(ErrorKind::kInput, e.what());
  }
  return parse_launch_record(text, path);
}

LaunchRecord record_of(const LaunchOptions& o, LaunchMode mode, int world_size,
                       const std::vector<std::string>& hosts) {
  LaunchRecord r;
  r.mode = mode;
  r.cwd = stdfs::current_path().string();
  r.world_size = world_size;
  r.nproc = o.launch.nproc;
  r.hosts = hosts;
  if (mode == LaunchMode::kSsh) {
    r.hostfile = absolute_or_empty(o.hostfile);
    r.selection = o.selection;
    r.remote_cwd = o.remote_cwd;
    r.ssh = o.ssh;
    r.ssh.key_file = absolute_or_empty(o.ssh.key_file);
    r.ssh.known_hosts = absolute_or_empty(o.ssh.known_hosts);
    for (const std::string& kv : o.env) {
      const std::string name = kv.substr(0, kv.find('='));
      const bool secret =
          secrets::is_secret_name(name) ||
          std::find(o.secret_env.begin(), o.secret_env.end(), name) != o.secret_env.end();
      (secret ? r.env_not_recorded : r.env).push_back(secret ? name : kv);
    }
  }
  if (mode == LaunchMode::kSlurm) {
    const char* job = std::getenv("SLURM_JOB_ID");
    r.slurm_job_id = job != nullptr ? job : "";
    r.slurm_nodes = o.launch.nproc > 0 ? world_size / o.launch.nproc : 0;
  }
  if (o.master_addr_given) r.master_addr = o.launch.master_addr;
  r.master_port = o.launch.master_port;
  r.secret_env = o.secret_env;
  r.environment = recorded_environment(environ, o.secret_env);
  r.log_dir = absolute_or_empty(o.launch.log_dir);
  r.stage_dir = absolute_or_empty(o.launch.stage_dir);
  r.grace_seconds = o.launch.grace_seconds;
  r.restart = o.launch.restart;
  r.min_nodes = o.min_nodes;
  r.allow_batch_change = o.allow_batch_change;
  return r;
}

std::vector<std::string> recorded_environment(const char* const* env,
                                              const std::vector<std::string>& secret_names) {
  std::vector<std::string> out;
  for (const auto& [name, value] : forwarded_variables(env)) {
    const bool secret =
        secrets::is_secret_name(name) ||
        std::find(secret_names.begin(), secret_names.end(), name) != secret_names.end();
    if (!secret) out.push_back(name + "=" + value);
  }
  return out;
}

std::string describe_launch(const LaunchRecord& r) {
  switch (r.mode) {
    case LaunchMode::kSsh: {
      std::string filter;
      const HostSelection& s = r.selection;
      if (!s.include.empty()) filter += " --include " + s.include;
      if (!s.exclude.empty()) filter += " --exclude " + s.exclude;
      if (s.num_nodes >= 0) filter += fmt::format(" --num_nodes {}", s.num_nodes);
      if (s.num_gpus >= 0) filter += fmt::format(" --num_gpus {}", s.num_gpus);
      return fmt::format("over SSH on {} host(s) of {}{}, {} rank(s)", r.hosts.size(), r.hostfile,
                         filter.empty() ? "" : " (" + filter.substr(1) + ")", r.world_size);
    }
    case LaunchMode::kSlurm:
      return fmt::format("under Slurm{}: {} node(s) x {} rank(s)",
                         r.slurm_job_id.empty() ? "" : " (job " + r.slurm_job_id + ")",
                         r.slurm_nodes, r.nproc);
    case LaunchMode::kLocal:
      break;
  }
  return fmt::format("on one machine: {} rank(s)", r.world_size);
}

}  // namespace dstrain::launcher
