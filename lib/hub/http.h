#pragma once
// HTTP through libcurl: one request at a time on one reused connection, redirects never followed
// here (the Hub's rules for following them, and for sending the token along, live in hub_api), and
// the retry policy huggingface_hub uses (retry 408, 429 and 5xx answers and transport failures,
// waiting 1, 2, 4, 8, 8 s, or what Retry-After asks for).
//
// Transport failures (no connection, timeout, a reset mid-body) are returned in
// HttpResponse::error rather than thrown, so callers decide whether to retry or resume.

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace dstrain::hub {

struct HttpRequest {
  std::string method = "GET";  // GET or HEAD
  std::string url;
  std::vector<std::string> headers;  // "Name: value"
  int timeout_s = 0;                 // the whole request; 0 = no limit
  int stall_timeout_s = 0;           // give up when no byte arrives for this long; 0 = no limit
};

struct HttpResponse {
  std::string error;                           // why no complete answer came; "" when one did
  long status = 0;                             // 0 when no status line arrived
  std::map<std::string, std::string> headers;  // names lower-cased; the first of repeated ones
  std::string body;                            // the body when no sink took it (kept up to 64 KiB)
  int64_t sink_bytes = 0;                      // bytes handed to the sink

  // The value of a header (name in any case), "" when absent.
  std::string header(const std::string& name) const;
  bool is_redirect() const;
};

// Receives the body of a 2xx answer as it arrives, with the answer's status and headers (`head`;
// its body is empty). May throw; the transfer then stops and the exception comes out of
// HttpClient::send.
using BodySink = std::function<void(const HttpResponse& head, const char* data, size_t size)>;

class HttpClient {
 public:
  HttpClient();
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // One request; a redirect is returned as it is. Only a 2xx body goes to `sink`.
  HttpResponse send(const HttpRequest& request, const BodySink& sink = nullptr);

 private:
  void* curl_;
};

// `location` (absolute or relative) resolved against `base`. Error(kIo) when either is malformed.
std::string resolve_url(const std::string& base, const std::string& location);

// "scheme://host:port" with the scheme's default port filled in: two URLs with the same origin
// are the same server.
std::string url_origin(const std::string& url);

// Percent-encoding as Python's urllib.parse.quote: letters, digits and "_.-~" stay, and '/' too
// when `keep_slash`.
std::string url_quote(const std::string& s, bool keep_slash);

// 408, 429 and 5xx: worth asking again.
bool is_retryable_status(long status);

// Seconds to wait before retry number `retry` (1-based): Retry-After when the answer gives it in
// seconds (at most 60), else 1, 2, 4, 8, 8, ...
double backoff_seconds(int retry, const HttpResponse& response);

// Sends `request` again after transport failures and retryable answers, up to `max_retries` times
// with backoff_seconds between tries; returns the last answer. `what` names the request in the
// warning each retry prints.
HttpResponse send_with_retries(HttpClient& client, const HttpRequest& request,
                               const std::string& what, int max_retries = 5);

}  // namespace dstrain::hub
