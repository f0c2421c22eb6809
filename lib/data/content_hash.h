#pragma once
// Content hashes for the token cache (token_cache.h): XXH3 with 128 bits from the xxHash library,
// fast enough to hash a dataset at disk speed, and wide enough that two different inputs sharing a
// cache entry is not a practical concern. Not cryptographic: it guards against stale data, not
// against an adversary.

#include <memory>
#include <string>
#include <string_view>

namespace dstrain::data {

class ContentHash {
 public:
  ContentHash();
  ~ContentHash();
  ContentHash(const ContentHash&) = delete;
  ContentHash& operator=(const ContentHash&) = delete;

  void update(std::string_view bytes);
  // The digest of everything fed so far, as 32 lowercase hex digits (the canonical byte order).
  std::string hex() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Digest of the bytes.
std::string hash_bytes(std::string_view bytes);

// Digest of a file's bytes, read in blocks. Error(kIo) naming the file when it cannot be read.
std::string hash_file(const std::string& path);

}  // namespace dstrain::data
