#pragma once
// The Hub's endpoints, called as huggingface_hub calls them:
//   GET  {endpoint}/api/models/{repo_id}/revision/{revision}   → {"sha": commit, "siblings":
//        [{"rfilename": ...}]}: the revision's commit and the repo's files
//   HEAD {endpoint}/{repo_id}/resolve/{revision}/{file}        → the file's metadata:
//   X-Repo-Commit,
//        ETag (or X-Linked-Etag for LFS files, which is their sha256), the size (X-Linked-Size, or
//        Content-Length of a direct answer), and for LFS files a redirect (Location) to a CDN
//   GET  the resolved location, with Range to resume
// Redirects are followed while they stay on the same origin (a renamed repo); a redirect to
// another origin (the CDN) ends the HEAD, and its Location is where the file is fetched from. The
// token goes only to the endpoint's origin, never to a CDN.
//
// Errors: the Hub's answers become messages a user can act on: 401/403 (gated or private repo, or
// a refused token) say to set HF_TOKEN; 404 says which of repo, revision or file is missing.
// Those are Error(kInput); a server that cannot be reached or keeps failing is Error(kIo).

#include <cstdint>
#include <string>
#include <vector>

#include "hub/http.h"
#include "hub/settings.h"

namespace dstrain::hub {

struct RepoRevision {
  std::string commit;
  std::vector<std::string> files;  // every file of the repo at that commit
};

struct FileMetadata {
  std::string commit;
  std::string etag;      // normalised: no W/ prefix, no quotes
  int64_t size = -1;     // -1 when the Hub did not say
  std::string location;  // where to GET the file
};

// The ETag header as a file name: W/"abc" and "abc" both give abc.
std::string normalize_etag(const std::string& header);

class HubClient {
 public:
  explicit HubClient(HubSettings settings);

  const HubSettings& settings() const { return settings_; }

  RepoRevision repo_revision(const std::string& repo_id, const std::string& revision);
  FileMetadata file_metadata(const std::string& repo_id, const std::string& revision,
                             const std::string& filename);

  // GET `url` from byte `offset` on (a Range request when offset > 0), following redirects (the
  // token only to the endpoint's origin). The body of a 2xx answer goes to `sink`; the answer is
  // returned as is, a transport failure in its `error`. No retries: the caller resumes.
  HttpResponse get_from(const std::string& url, int64_t offset, const BodySink& sink);

  // {endpoint}/{repo_id}/resolve/{revision}/{filename}, quoted as huggingface_hub quotes it.
  std::string resolve_url(const std::string& repo_id, const std::string& revision,
                          const std::string& filename) const;

  // Error for a final non-success answer about `repo_id` (at `revision`, for `filename` if any).
  [[noreturn]] void fail_for_answer(const HttpResponse& r, const std::string& url,
                                    const std::string& repo_id, const std::string& revision,
                                    const std::string& filename = "") const;

 private:
  std::vector<std::string> headers_for(const std::string& url) const;

  HubSettings settings_;
  std::string endpoint_origin_;
  HttpClient http_;
};

}  // namespace dstrain::hub
