#include "hub/hub_api.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "hub/cache_layout.h"

namespace dstrain::hub {
namespace {

constexpr int kMaxRedirects = 10;

int64_t parse_size(const std::string& s) {
  if (s.empty() || s.size() > 18 || s.find_first_not_of("0123456789") != std::string::npos)
    return -1;
  return std::stoll(s);
}

std::string quoted_detail(const HttpResponse& r) {
  std::string m = r.header("x-error-message");
  if (m.empty() && r.body.size() < 300 && r.body.find('<') == std::string::npos) m = r.body;
  while (!m.empty() && (m.back() == '\n' || m.back() == '\r')) m.pop_back();
  return m.empty() ? std::string() : ": " + m;
}

[[noreturn]] void fail_unreachable(const std::string& url, const HttpResponse& r) {
  fail(ErrorKind::kIo,
       "cannot reach the Hub: {} failed: {} (HF_ENDPOINT sets the server; HF_HUB_OFFLINE=1 uses "
       "only the local cache)",
       url, r.error);
}

}  // namespace

std::string normalize_etag(const std::string& header) {
  std::string e = header.rfind("W/", 0) == 0 ? header.substr(2) : header;
  const auto first = e.find_first_not_of('"');
  if (first == std::string::npos) return {};
  return e.substr(first, e.find_last_not_of('"') - first + 1);
}

HubClient::HubClient(HubSettings settings)
    : settings_(std::move(settings)), endpoint_origin_(url_origin(settings_.endpoint)) {}

std::string HubClient::resolve_url(const std::string& repo_id, const std::string& revision,
                                   const std::string& filename) const {
  return settings_.endpoint + "/" + repo_id + "/resolve/" + url_quote(revision, false) + "/" +
         url_quote(filename, true);
}

std::vector<std::string> HubClient::headers_for(const std::string& url) const {
  std::vector<std::string> h;
  if (!settings_.token.empty() && url_origin(url) == endpoint_origin_)
    h.push_back("Authorization: Bearer " + settings_.token);
  return h;
}

RepoRevision HubClient::repo_revision(const std::string& repo_id, const std::string& revision) {
  std::string url =
      settings_.endpoint + "/api/models/" + repo_id + "/revision/" + url_quote(revision, false);
  HttpResponse r;
  for (int hop = 0; hop <= kMaxRedirects; ++hop) {
    HttpRequest req{"GET", url, headers_for(url), settings_.metadata_timeout_s, 0};
    r = send_with_retries(http_, req, "GET " + url, settings_.max_retries);
    if (!r.error.empty()) fail_unreachable(url, r);
    if (!r.is_redirect()) break;
    url = hub::resolve_url(url, r.header("location"));
  }
  if (r.status != 200) fail_for_answer(r, url, repo_id, revision);
  RepoRevision out;
  try {
    const auto j = nlohmann::json::parse(r.body);
    out.commit = j.at("sha").get<std::string>();
    for (const auto& s : j.at("siblings"))
      out.files.push_back(s.at("rfilename").get<std::string>());
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorKind::kIo, "{}: the answer is not the Hub's repo info (sha, siblings): {}", url,
         e.what());
  }
  if (!is_commit_hash(out.commit))
    fail(ErrorKind::kIo, "{}: the answer names the commit '{}', not a 40-digit hash", url,
         out.commit);
  return out;
}

FileMetadata HubClient::file_metadata(const std::string& repo_id, const std::string& revision,
                                      const std::string& filename) {
  std::string url = resolve_url(repo_id, revision, filename);
  HttpResponse r;
  std::string cdn;  // a redirect to another origin: the file is fetched there
  for (int hop = 0; hop <= kMaxRedirects; ++hop) {
    std::vector<std::string> headers = headers_for(url);
    headers.push_back("Accept-Encoding: identity");  // the size of the file, not of a gzip of it
    r = send_with_retries(http_, {"HEAD", url, headers, settings_.metadata_timeout_s, 0},
                          "HEAD " + url, settings_.max_retries);
    if (!r.error.empty()) fail_unreachable(url, r);
    if (!r.is_redirect()) break;
    const std::string target = hub::resolve_url(url, r.header("location"));
    if (url_origin(target) != url_origin(url)) {
      cdn = target;
      break;
    }
    url = target;
  }
  if (r.status >= 400 || (r.is_redirect() && cdn.empty()))
    fail_for_answer(r, url, repo_id, revision, filename);
  FileMetadata m;
  m.commit = r.header("x-repo-commit");
  m.etag = normalize_etag(!r.header("x-linked-etag").empty() ? r.header("x-linked-etag")
                                                             : r.header("etag"));
  m.location = cdn.empty() ? url : cdn;
  m.size = parse_size(r.header("x-linked-size"));
  if (m.size < 0 && cdn.empty()) m.size = parse_size(r.header("content-length"));
  if (m.commit.empty())
    fail(ErrorKind::kIo,
         "{}: the answer has no X-Repo-Commit header, so it does not come from a Hugging Face Hub "
         "(HF_ENDPOINT is {}; check it, and any proxy in between)",
         url, settings_.endpoint);
  if (m.etag.empty())
    fail(ErrorKind::kIo, "{}: the answer has no ETag, so the file cannot be cached reliably", url);
  return m;
}

HttpResponse HubClient::get_from(const std::string& start_url, int64_t offset,
                                 const BodySink& sink) {
  std::string url = start_url;
  for (int hop = 0; hop <= kMaxRedirects; ++hop) {
    std::vector<std::string> headers = headers_for(url);
    if (offset > 0) headers.push_back("Range: bytes=" + std::to_string(offset) + "-");
    HttpResponse r = http_.send({"GET", url, headers, 0, settings_.download_timeout_s}, sink);
    if (!r.error.empty() || !r.is_redirect()) return r;
    url = hub::resolve_url(url, r.header("location"));
  }
  fail(ErrorKind::kIo, "{}: more than {} redirects", start_url, kMaxRedirects);
}

void HubClient::fail_for_answer(const HttpResponse& r, const std::string& url,
                                const std::string& repo_id, const std::string& revision,
                                const std::string& filename) const {
  const std::string code = r.header("x-error-code");
  const std::string detail = quoted_detail(r);
  const std::string token =
      settings_.token.empty()
          ? "no token was sent: set HF_TOKEN (or log in with `hf auth login`, which writes "
            "$HF_HOME/token) to a token of an account that has access"
          : fmt::format(
                "the token from {} was sent: check that it is valid and that its "
                "account has access",
                settings_.token_source);
  if (code == "GatedRepo")
    fail(ErrorKind::kInput,
         "model '{}' is a gated repository and the Hub refused access (HTTP {}{}); {}; access "
         "is requested at {}/{}",
         repo_id, r.status, detail, token, settings_.endpoint, repo_id);
  if (code == "RevisionNotFound")
    fail(ErrorKind::kInput,
         "model '{}' has no revision '{}' (model.revision: a branch, tag or commit)", repo_id,
         revision);
  if (code == "EntryNotFound")
    fail(ErrorKind::kInput, "model '{}' at revision '{}' has no file '{}'", repo_id, revision,
         filename);
  if (r.status == 401 || r.status == 403 || code == "RepoNotFound")
    fail(ErrorKind::kInput,
         "model '{}' was not found on {}, or it is private or gated (HTTP {}{}); {}", repo_id,
         settings_.endpoint, r.status, detail, token);
  if (r.status == 404)
    fail(ErrorKind::kInput, "model '{}': {} answered 404 Not Found{}", repo_id, url, detail);
  fail(ErrorKind::kIo, "model '{}': {} answered HTTP {}{}", repo_id, url, r.status, detail);
}

}  // namespace dstrain::hub
