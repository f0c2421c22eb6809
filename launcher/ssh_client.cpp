#include "launcher/ssh_client.h"

#include <libssh/libssh.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <algorithm>

#include "core/error.h"

namespace dstrain::launcher {
namespace {

void set_socket_keepalive(int fd, double keepalive_seconds) {
  if (fd < 0) return;
  int on = 1;
  int idle = std::max(1, static_cast<int>(keepalive_seconds / 3));
  int count = 3;
  unsigned int user_timeout_ms = static_cast<unsigned int>(keepalive_seconds * 1000);
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &idle, sizeof(idle));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
  ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof(user_timeout_ms));
}

}  // namespace

std::string describe_target(const SshTarget& t) {
  std::string out = t.user.empty() ? t.host : t.user + "@" + t.host;
  if (t.port != 0) out += ":" + std::to_string(t.port);
  return out;
}

struct SshSession::Impl {
  ssh_session session = nullptr;
  ssh_channel channel = nullptr;
  std::string name;
  SshSettings settings;

  [[noreturn]] void fail_ssh(const std::string& what) {
    fail(ErrorKind::kComm, "ssh {}: {}: {}", name, what, ssh_get_error(session));
  }

  void configure(const SshTarget& t) {
    session = ssh_new();
    if (session == nullptr) fail(ErrorKind::kComm, "ssh {}: cannot create a session", name);
    ssh_options_set(session, SSH_OPTIONS_HOST, t.host.c_str());
    ssh_options_parse_config(session, nullptr);  // ~/.ssh/config; explicit settings below win
    if (!t.user.empty()) ssh_options_set(session, SSH_OPTIONS_USER, t.user.c_str());
    if (t.port != 0) {
      unsigned int port = static_cast<unsigned int>(t.port);
      ssh_options_set(session, SSH_OPTIONS_PORT, &port);
    }
    long timeout = std::max(1L, static_cast<long>(settings.connect_timeout + 0.5));
    ssh_options_set(session, SSH_OPTIONS_TIMEOUT, &timeout);
    if (!settings.known_hosts.empty()) {
      ssh_options_set(session, SSH_OPTIONS_KNOWNHOSTS, settings.known_hosts.c_str());
      ssh_options_set(session, SSH_OPTIONS_GLOBAL_KNOWNHOSTS, "/dev/null");
    }
    int nodelay = 1;
    ssh_options_set(session, SSH_OPTIONS_NODELAY, &nodelay);
  }

  std::string known_hosts_file() const {
    return settings.known_hosts.empty() ? "~/.ssh/known_hosts" : settings.known_hosts;
  }

  void verify_host_key(const SshTarget& t) {
    ssh_known_hosts_e state = ssh_session_is_known_server(session);
    switch (state) {
      case SSH_KNOWN_HOSTS_OK:
        return;
      case SSH_KNOWN_HOSTS_CHANGED:
      case SSH_KNOWN_HOSTS_OTHER:
        fail(ErrorKind::kComm,
             "ssh {}: the host key does NOT match the one in {} (a changed key can mean an attack;"
             " if the host was reinstalled, remove the old key with ssh-keygen -R)",
             name, known_hosts_file());
      case SSH_KNOWN_HOSTS_NOT_FOUND:
      case SSH_KNOWN_HOSTS_UNKNOWN:
        if (settings.accept_new_host_keys) {
          if (ssh_session_update_known_hosts(session) != SSH_OK)
            fail_ssh("cannot add the new host key to " + known_hosts_file());
          return;
        }
        fail(ErrorKind::kComm,
             "ssh {}: the host key is not in {} (connect once with ssh, or add it with "
             "ssh-keyscan{} {} >> {}, or pass --ssh-accept-new-host-keys)",
             name, known_hosts_file(), t.port != 0 ? " -p " + std::to_string(t.port) : "", t.host,
             known_hosts_file());
      case SSH_KNOWN_HOSTS_ERROR:
        fail_ssh("cannot check the host key");
    }
  }

  void authenticate() {
    int rc = SSH_AUTH_DENIED;
    if (!settings.key_file.empty()) {
      ssh_key key = nullptr;
      if (ssh_pki_import_privkey_file(settings.key_file.c_str(), nullptr, nullptr, nullptr, &key) !=
          SSH_OK) {
        fail(ErrorKind::kUsage,
             "--ssh-key {}: cannot read the private key (missing, or "
             "protected by a passphrase: load it into ssh-agent instead)",
             settings.key_file);
      }
      rc = ssh_userauth_publickey(session, nullptr, key);
      ssh_key_free(key);
    } else {
      rc = ssh_userauth_publickey_auto(session, nullptr, nullptr);
    }
    if (rc == SSH_AUTH_SUCCESS) return;
    if (rc == SSH_AUTH_ERROR) fail_ssh("authentication failed");
    fail(ErrorKind::kComm,
         "ssh {}: public key authentication was refused (tried {}); check "
         "authorized_keys on the host and the user name",
         name, settings.key_file.empty() ? "ssh-agent and ~/.ssh/id_*" : settings.key_file);
  }
};

SshSession::SshSession(const SshTarget& target, const SshSettings& settings)
    : impl_(std::make_unique<Impl>()) {
  impl_->name = describe_target(target);
  impl_->settings = settings;
  impl_->configure(target);
  if (ssh_connect(impl_->session) != SSH_OK) impl_->fail_ssh("cannot connect");
  set_socket_keepalive(ssh_get_fd(impl_->session), settings.keepalive_seconds);
  impl_->verify_host_key(target);
  impl_->authenticate();
}

SshSession::~SshSession() {
  if (impl_->channel != nullptr) {
    ssh_channel_close(impl_->channel);
    ssh_channel_free(impl_->channel);
  }
  if (impl_->session != nullptr) {
    ssh_disconnect(impl_->session);
    ssh_free(impl_->session);
  }
}

void SshSession::exec(const std::string& command) {
  impl_->channel = ssh_channel_new(impl_->session);
  if (impl_->channel == nullptr) impl_->fail_ssh("cannot create a channel");
  if (ssh_channel_open_session(impl_->channel) != SSH_OK) impl_->fail_ssh("cannot open a session");
  if (ssh_channel_request_exec(impl_->channel, command.c_str()) != SSH_OK)
    impl_->fail_ssh("cannot start the remote command");
}

bool SshSession::read(std::string* out, std::string* err, int timeout_ms) {
  char buf[32768];
  ssh_channel ch = impl_->channel;
  int n = ssh_channel_read_timeout(ch, buf, sizeof(buf), 0, timeout_ms);
  if (n == SSH_ERROR) impl_->fail_ssh("connection lost");
  if (n > 0) out->append(buf, static_cast<size_t>(n));
  while ((n = ssh_channel_read_nonblocking(ch, buf, sizeof(buf), 1)) > 0) {
    err->append(buf, static_cast<size_t>(n));
  }
  if (n == SSH_ERROR) impl_->fail_ssh("connection lost");
  if (ssh_get_status(impl_->session) & (SSH_CLOSED | SSH_CLOSED_ERROR))
    impl_->fail_ssh("connection lost");
  bool done =
      ssh_channel_is_closed(ch) ||
      (ssh_channel_is_eof(ch) && ssh_channel_poll(ch, 0) <= 0 && ssh_channel_poll(ch, 1) <= 0);
  return !done;
}

void SshSession::send_eof() {
  if (impl_->channel != nullptr && ssh_channel_is_open(impl_->channel))
    ssh_channel_send_eof(impl_->channel);
}

void SshSession::write_stdin(const std::string& data) {
  if (impl_->channel != nullptr && ssh_channel_is_open(impl_->channel))
    ssh_channel_write(impl_->channel, data.data(), static_cast<uint32_t>(data.size()));
}

int SshSession::exit_status() {
  return impl_->channel == nullptr ? -1 : ssh_channel_get_exit_status(impl_->channel);
}

}  // namespace dstrain::launcher
