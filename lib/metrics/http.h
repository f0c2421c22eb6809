#pragma once
// A small blocking HTTP client over libcurl for the experiment trackers: one request at a time on
// one reused connection, a bounded time for every request, no redirects, no retries (the caller's
// policy). Not thread-safe: one client per thread.
//
// lib/hub has its own client for downloads (GET/HEAD, streaming, Hub retry rules); this one sends
// bodies (POST/PUT). Both are small; a shared one can come later in a module both can depend on.

#include <functional>
#include <string>
#include <vector>

namespace dstrain::metrics {

struct HttpRequest {
  std::string method = "GET";  // GET, POST, PUT
  std::string url;
  std::vector<std::string> headers;  // "Name: value"
  std::string body;
  std::string userpwd;           // "user:password" for basic authentication; "" = none
  double timeout_s = 10;         // the whole request
  double connect_timeout_s = 5;  // connecting alone
  // Polled while the request runs (every 50 ms at the latest): true aborts it.
  std::function<bool()> cancelled;
};

struct HttpResponse {
  std::string error;  // why no answer came (curl's words: refused, timed out, ...); "" if one did
  long status = 0;    // 0 when no answer came
  std::string body;   // kept up to 1 MiB

  bool ok() const { return error.empty() && status >= 200 && status < 300; }
};

class HttpClient {
 public:
  HttpClient();
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Transport failures come back in HttpResponse::error, never as exceptions.
  HttpResponse send(const HttpRequest& request);

 private:
  void* curl_;   // the request's handle, reset for each request
  void* multi_;  // runs it, so that `cancelled` is polled at a fixed interval; keeps the
                 // connection for the next request
};

// `text` escaped for a URL query value or path segment ("a b/c" → "a%20b%2Fc").
std::string url_escape(const std::string& text);

}  // namespace dstrain::metrics
