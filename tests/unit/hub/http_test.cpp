// The pieces of the HTTP layer that need no server: URL handling, ETags, SHA-256 and backoff.
// Requests against a server are tested end to end with a local Hub in tests/reference/test_hub.py.

#include <gtest/gtest.h>

#include "hub/blob_download.h"
#include "hub/http.h"
#include "hub/hub_api.h"
#include "hub/sha256.h"
#include "hub_test_util.h"

namespace dstrain::hub {
namespace {

TEST(Http, QuoteAsPythonsUrllib) {
  EXPECT_EQ(url_quote("refs/pr/1", false), "refs%2Fpr%2F1");
  EXPECT_EQ(url_quote("sub dir/a+b~c.json", true), "sub%20dir/a%2Bb~c.json");
}

TEST(Http, OriginsCompareSchemeHostAndPort) {
  EXPECT_EQ(url_origin("https://HuggingFace.co/x"), "https://huggingface.co:443");
  EXPECT_EQ(url_origin("http://127.0.0.1:8080/a?b"), "http://127.0.0.1:8080");
  EXPECT_NE(url_origin("http://127.0.0.1:8080/a"), url_origin("http://127.0.0.1:8081/a"));
  EXPECT_NE(url_origin("http://127.0.0.1:8080/a"), url_origin("http://localhost:8080/a"));
}

TEST(Http, RedirectTargetsResolveAgainstTheRequest) {
  EXPECT_EQ(resolve_url("http://h:1/Org/M/resolve/main/x", "/New/M/resolve/main/x"),
            "http://h:1/New/M/resolve/main/x");
  EXPECT_EQ(resolve_url("http://h:1/a/b", "https://cdn.example/blob?sig=1"),
            "https://cdn.example/blob?sig=1");
}

TEST(Http, EtagsAreNormalisedAsHuggingFaceHubDoes) {
  EXPECT_EQ(normalize_etag("\"abc\""), "abc");
  EXPECT_EQ(normalize_etag("W/\"abc\""), "abc");
  EXPECT_EQ(normalize_etag("abc"), "abc");
  EXPECT_EQ(normalize_etag(""), "");
}

TEST(Http, BackoffDoublesToEightOrFollowsRetryAfter) {
  HttpResponse r;
  EXPECT_EQ(backoff_seconds(1, r), 1);
  EXPECT_EQ(backoff_seconds(2, r), 2);
  EXPECT_EQ(backoff_seconds(4, r), 8);
  EXPECT_EQ(backoff_seconds(9, r), 8);
  r.headers["retry-after"] = "3";
  EXPECT_EQ(backoff_seconds(1, r), 3);
  r.headers["retry-after"] = "3600";
  EXPECT_EQ(backoff_seconds(1, r), 60);
  EXPECT_TRUE(is_retryable_status(429));
  EXPECT_TRUE(is_retryable_status(503));
  EXPECT_FALSE(is_retryable_status(404));
}

TEST(Http, Sha256MatchesTheStandardVectors) {
  Sha256 h;
  EXPECT_EQ(h.hex_digest(), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  h.update("ab", 2);
  h.update("c", 1);
  const std::string abc = h.hex_digest();
  EXPECT_EQ(abc, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_TRUE(is_sha256(abc));
  EXPECT_FALSE(is_sha256("da39a3ee5e6b4b0d3255bfef95601890afd80709"));  // a git sha1
}

TEST(Http, FilePrefixHashesLikeTheBytes) {
  testing::TempDir dir;
  testing::write(dir / "f", "abcdef");
  Sha256 h;
  hash_file_prefix(dir / "f", 3, h);
  EXPECT_EQ(h.hex_digest(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  testing::expect_error([&] { hash_file_prefix(dir / "f", 7, h); }, ErrorKind::kIo, {"f"});
}

}  // namespace
}  // namespace dstrain::hub
