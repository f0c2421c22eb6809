#include "metrics/mlflow_artifacts.h"

#include <cctype>
#include <filesystem>

#include "core/error.h"
#include "core/fs.h"
#include "core/text.h"

namespace dstrain::metrics {
namespace {

namespace stdfs = std::filesystem;

constexpr const char* kProxyScheme = "mlflow-artifacts:";
constexpr const char* kFileScheme = "file:";

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  const char l = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (l >= 'a' && l <= 'f') return l - 'a' + 10;
  return -1;
}

// %XX → the byte (Python's urllib.parse.unquote, which url2pathname applies); a malformed escape
// stays as written, as there.
std::string percent_decoded(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && hex_value(s[i + 1]) >= 0 && hex_value(s[i + 2]) >= 0) {
      out += static_cast<char>(hex_value(s[i + 1]) * 16 + hex_value(s[i + 2]));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

// A URI scheme: letters, digits, + - . after a letter, then ':' (RFC 3986).
bool has_scheme(const std::string& uri) {
  const size_t colon = uri.find(':');
  if (colon == std::string::npos || colon == 0 || !std::isalpha(static_cast<unsigned char>(uri[0])))
    return false;
  for (size_t i = 1; i < colon; ++i) {
    const char c = uri[i];
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '+' && c != '-' && c != '.')
      return false;
  }
  return true;
}

}  // namespace

bool is_proxied_artifact_uri(const std::string& artifact_uri) {
  return starts_with(artifact_uri, kProxyScheme);
}

std::string local_artifact_dir(const std::string& artifact_uri) {
  std::string path = artifact_uri;
  if (starts_with(path, kFileScheme)) {
    path = path.substr(std::string(kFileScheme).size());
    if (starts_with(path, "//")) {  // an authority: empty or localhost means this machine
      const size_t slash = path.find('/', 2);
      const std::string host = path.substr(2, slash == std::string::npos ? slash : slash - 2);
      if (!host.empty() && host != "localhost") return "";
      path = slash == std::string::npos ? "" : path.substr(slash);
    }
    const size_t query = path.find_first_of("?#");
    if (query != std::string::npos) path.resize(query);
  } else if (has_scheme(path)) {
    return "";
  }
  path = percent_decoded(path);
  if (path.empty() || path.front() != '/') return "";
  return path;
}

void write_local_artifact(const std::string& artifact_uri, const std::string& path,
                          const std::string& content) {
  const std::string dir = local_artifact_dir(artifact_uri);
  if (dir.empty()) {
    fail(ErrorKind::kIo,
         "the run's artifact location {} is neither served by the tracking server (start it "
         "with --serve-artifacts) nor a directory of this machine",
         artifact_uri);
  }
  // <root>/<experiment>/<run>/artifacts: the root is the directory a server is started with.
  const stdfs::path artifacts = stdfs::path(dir).lexically_normal();
  const stdfs::path root = artifacts.parent_path().parent_path().parent_path();
  std::error_code ec;
  if (!stdfs::is_directory(root, ec)) {
    fail(ErrorKind::kIo,
         "the run's artifact location {} is not reachable from this machine: its artifact root {} "
         "does not exist here (mount the tracking server's artifact directory at the same path)",
         artifact_uri, root.string());
  }
  const stdfs::path target = artifacts / path;
  fs::create_dirs(target.parent_path());
  fs::write_file_atomic(target, content);
}

}  // namespace dstrain::metrics
