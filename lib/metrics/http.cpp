#include "metrics/http.h"

#include <curl/curl.h>

#include <mutex>

#include "core/error.h"

namespace dstrain::metrics {
namespace {

constexpr size_t kMaxBody = 1 << 20;

void global_init() {
  // curl_global_init is not thread-safe against itself; once per process.
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

size_t on_body(char* data, size_t size, size_t count, void* user) {
  auto* body = static_cast<std::string*>(user);
  const size_t n = size * count;
  if (body->size() < kMaxBody) body->append(data, std::min(n, kMaxBody - body->size()));
  return n;
}

int on_progress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  const auto* cancelled = static_cast<const std::function<bool()>*>(user);
  return (*cancelled)() ? 1 : 0;  // non-zero: curl aborts with CURLE_ABORTED_BY_CALLBACK
}

}  // namespace

HttpClient::HttpClient() {
  global_init();
  curl_ = curl_easy_init();
  if (curl_ == nullptr) fail(ErrorKind::kIo, "libcurl: cannot create a handle");
}

HttpClient::~HttpClient() {
  curl_easy_cleanup(static_cast<CURL*>(curl_));
}

HttpResponse HttpClient::send(const HttpRequest& request) {
  CURL* c = static_cast<CURL*>(curl_);
  curl_easy_reset(c);  // keeps the connection cache, drops the previous request's options
  HttpResponse response;
  curl_slist* headers = nullptr;
  for (const auto& h : request.headers) headers = curl_slist_append(headers, h.c_str());
  curl_easy_setopt(c, CURLOPT_URL, request.url.c_str());
  curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, request.method.c_str());
  if (request.method != "GET") {
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, request.body.data());
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(request.body.size()));
  }
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  if (!request.userpwd.empty()) {
    curl_easy_setopt(c, CURLOPT_HTTPAUTH, CURLAUTH_BASIC);
    curl_easy_setopt(c, CURLOPT_USERPWD, request.userpwd.c_str());
  }
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(request.timeout_s * 1000));
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(request.connect_timeout_s * 1000));
  // A thread of a process that also uses signals: no SIGALRM-based DNS timeouts, no SIGPIPE.
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &response.body);
  curl_easy_setopt(c, CURLOPT_USERAGENT, "dstrain");
  if (request.cancelled) {
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, &request.cancelled);
  }
  const CURLcode rc = curl_easy_perform(c);
  curl_slist_free_all(headers);
  if (rc != CURLE_OK) {
    response.error = curl_easy_strerror(rc);
    return response;
  }
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &response.status);
  return response;
}

std::string url_escape(const std::string& text) {
  global_init();
  char* e = curl_easy_escape(nullptr, text.c_str(), static_cast<int>(text.size()));
  if (e == nullptr) fail(ErrorKind::kIo, "libcurl: cannot escape a URL part");
  std::string out(e);
  curl_free(e);
  return out;
}

}  // namespace dstrain::metrics
