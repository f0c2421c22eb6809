#include "hub/http.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <exception>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/log.h"

namespace dstrain::hub {
namespace {

constexpr size_t kMaxKeptBody = 64 * 1024;

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
      fail(ErrorKind::kInternal, "curl_global_init failed");
  });
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

std::string trim(const std::string& s) {
  const auto first = s.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return {};
  return s.substr(first, s.find_last_not_of(" \t\r\n") - first + 1);
}

// State of one transfer, shared with libcurl's callbacks.
struct Transfer {
  HttpResponse response;
  const BodySink* sink = nullptr;
  std::exception_ptr sink_error;
};

// Called once per header line. A status line starts a new answer (libcurl also reports interim
// ones such as "100 Continue").
size_t on_header(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const std::string line(data, size * count);
  if (line.rfind("HTTP/", 0) == 0) {
    t->response.headers.clear();
    const auto space = line.find(' ');
    t->response.status = space == std::string::npos ? 0 : std::atol(line.c_str() + space + 1);
    return size * count;
  }
  const auto colon = line.find(':');
  if (colon != std::string::npos)
    t->response.headers.emplace(lower(trim(line.substr(0, colon))), trim(line.substr(colon + 1)));
  return size * count;
}

size_t on_body(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t n = size * count;
  const bool success = t->response.status >= 200 && t->response.status < 300;
  if (success && t->sink != nullptr && *t->sink) {
    try {
      (*t->sink)(t->response, data, n);
      t->response.sink_bytes += static_cast<int64_t>(n);
    } catch (...) {
      t->sink_error = std::current_exception();
      return 0;  // stops the transfer with CURLE_WRITE_ERROR
    }
    return n;
  }
  const size_t keep = std::min(n, kMaxKeptBody - std::min(kMaxKeptBody, t->response.body.size()));
  t->response.body.append(data, keep);
  return n;
}

struct CurlUrl {
  CURLU* u = curl_url();
  ~CurlUrl() { curl_url_cleanup(u); }
  std::string get(CURLUPart part, unsigned flags = 0) const {
    char* out = nullptr;
    if (curl_url_get(u, part, &out, flags) != CURLUE_OK) return {};
    std::string s(out);
    curl_free(out);
    return s;
  }
};

}  // namespace

std::string HttpResponse::header(const std::string& name) const {
  const auto it = headers.find(lower(name));
  return it == headers.end() ? std::string() : it->second;
}

bool HttpResponse::is_redirect() const {
  return status >= 300 && status < 400 && !header("location").empty();
}

HttpClient::HttpClient() {
  global_init();
  curl_ = curl_easy_init();
  if (curl_ == nullptr) fail(ErrorKind::kInternal, "curl_easy_init failed");
}

HttpClient::~HttpClient() {
  curl_easy_cleanup(static_cast<CURL*>(curl_));
}

HttpResponse HttpClient::send(const HttpRequest& request, const BodySink& sink) {
  CURL* c = static_cast<CURL*>(curl_);
  curl_easy_reset(c);  // keeps the open connection for the next request to the same server
  Transfer t;
  t.sink = &sink;
  curl_slist* headers = nullptr;
  for (const auto& h : request.headers) headers = curl_slist_append(headers, h.c_str());
  char error[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(c, CURLOPT_URL, request.url.c_str());
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(c, CURLOPT_USERAGENT, "dstrain (huggingface_hub-compatible)");
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 10L);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &t);
  if (request.method == "HEAD") curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  if (request.timeout_s > 0) curl_easy_setopt(c, CURLOPT_TIMEOUT, long{request.timeout_s});
  if (request.stall_timeout_s > 0) {
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, long{request.stall_timeout_s});
  }
  const CURLcode rc = curl_easy_perform(c);
  curl_slist_free_all(headers);
  if (t.sink_error) std::rethrow_exception(t.sink_error);
  if (rc != CURLE_OK) t.response.error = error[0] != '\0' ? error : curl_easy_strerror(rc);
  return std::move(t.response);
}

std::string resolve_url(const std::string& base, const std::string& location) {
  CurlUrl url;
  if (curl_url_set(url.u, CURLUPART_URL, base.c_str(), 0) != CURLUE_OK ||
      curl_url_set(url.u, CURLUPART_URL, location.c_str(), 0) != CURLUE_OK)
    fail(ErrorKind::kIo, "cannot resolve the URL '{}' against '{}'", location, base);
  return url.get(CURLUPART_URL);
}

std::string url_origin(const std::string& url) {
  CurlUrl u;
  if (curl_url_set(u.u, CURLUPART_URL, url.c_str(), 0) != CURLUE_OK)
    fail(ErrorKind::kIo, "malformed URL '{}'", url);
  return lower(u.get(CURLUPART_SCHEME)) + "://" + lower(u.get(CURLUPART_HOST)) + ":" +
         u.get(CURLUPART_PORT, CURLU_DEFAULT_PORT);
}

std::string url_quote(const std::string& s, bool keep_slash) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char ch : s) {
    if (std::isalnum(ch) || ch == '_' || ch == '.' || ch == '-' || ch == '~' ||
        (keep_slash && ch == '/')) {
      out += static_cast<char>(ch);
    } else {
      out += '%';
      out += kHex[ch >> 4];
      out += kHex[ch & 15];
    }
  }
  return out;
}

bool is_retryable_status(long status) {
  return status == 408 || status == 429 || (status >= 500 && status < 600);
}

double backoff_seconds(int retry, const HttpResponse& response) {
  const std::string after = response.header("retry-after");
  const bool seconds =
      !after.empty() && after.size() < 10 &&
      std::all_of(after.begin(), after.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
  if (seconds) return std::min(60.0, std::stod(after));
  return std::min(8.0, static_cast<double>(1 << std::min(retry - 1, 3)));
}

HttpResponse send_with_retries(HttpClient& client, const HttpRequest& request,
                               const std::string& what, int max_retries) {
  for (int retry = 1;; ++retry) {
    HttpResponse r = client.send(request);
    const bool transient = !r.error.empty() || is_retryable_status(r.status);
    if (!transient || retry > max_retries) return r;
    const double wait = backoff_seconds(retry, r);
    log::warn("{}: {}; retrying in {:.0f} s ({} of {})", what,
              r.error.empty() ? fmt::format("HTTP {}", r.status) : r.error, wait, retry,
              max_retries);
    std::this_thread::sleep_for(std::chrono::duration<double>(wait));
  }
}

}  // namespace dstrain::hub
