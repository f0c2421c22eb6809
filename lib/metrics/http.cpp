#include "metrics/http.h"

#include <curl/curl.h>

#include <mutex>

#include "core/error.h"

namespace dstrain::metrics {
namespace {

constexpr size_t kMaxBody = 1 << 20;
// How often a running request checks whether it is cancelled. libcurl's progress callback comes
// about once a second only while nothing is transferred, which is when a request waits on a slow
// server, too late for a caller whose deadline is a couple of seconds away.
constexpr int kCancelPollMs = 50;

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

// Runs the request added to `multi` until it ends, or until `cancelled` says so
// (CURLE_ABORTED_BY_CALLBACK, as an aborting progress callback would give).
CURLcode perform(CURLM* multi, const std::function<bool()>& cancelled) {
  int running = 1;
  while (true) {
    if (curl_multi_perform(multi, &running) != CURLM_OK) return CURLE_FAILED_INIT;
    if (running == 0) break;
    if (cancelled && cancelled()) return CURLE_ABORTED_BY_CALLBACK;
    if (curl_multi_poll(multi, nullptr, 0, kCancelPollMs, nullptr) != CURLM_OK) {
      return CURLE_FAILED_INIT;
    }
  }
  int left = 0;
  while (CURLMsg* msg = curl_multi_info_read(multi, &left)) {
    if (msg->msg == CURLMSG_DONE) return msg->data.result;
  }
  return CURLE_FAILED_INIT;
}

}  // namespace

HttpClient::HttpClient() {
  global_init();
  curl_ = curl_easy_init();
  multi_ = curl_multi_init();
  if (curl_ == nullptr || multi_ == nullptr) {
    curl_easy_cleanup(static_cast<CURL*>(curl_));
    curl_multi_cleanup(static_cast<CURLM*>(multi_));
    fail(ErrorKind::kIo, "libcurl: cannot create a handle");
  }
}

HttpClient::~HttpClient() {
  curl_multi_cleanup(static_cast<CURLM*>(multi_));
  curl_easy_cleanup(static_cast<CURL*>(curl_));
}

HttpResponse HttpClient::send(const HttpRequest& request) {
  CURL* c = static_cast<CURL*>(curl_);
  curl_easy_reset(c);  // drops the previous request's options (connections stay with multi_)
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
  CURLM* multi = static_cast<CURLM*>(multi_);
  CURLcode rc = CURLE_FAILED_INIT;
  if (curl_multi_add_handle(multi, c) == CURLM_OK) {
    rc = perform(multi, request.cancelled);
    curl_multi_remove_handle(multi, c);
  }
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
