#pragma once
// Streaming SHA-256 (OpenSSL's), for checking downloaded LFS files against the sha256 the Hub
// names them by.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

namespace dstrain::hub {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void update(const void* data, size_t size);
  // The digest as 64 lowercase hex digits; the object starts over afterwards.
  std::string hex_digest();
  void reset();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Feeds the first `size` bytes of `file` into `hash`. Error(kIo) when they cannot be read.
void hash_file_prefix(const std::filesystem::path& file, int64_t size, Sha256& hash);

}  // namespace dstrain::hub
