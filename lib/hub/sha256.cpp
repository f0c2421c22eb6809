#include "hub/sha256.h"

#include <openssl/evp.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <vector>

#include "core/error.h"

namespace dstrain::hub {

struct Sha256::Impl {
  EVP_MD_CTX* ctx = nullptr;
};

Sha256::Sha256() : impl_(std::make_unique<Impl>()) {
  impl_->ctx = EVP_MD_CTX_new();
  if (impl_->ctx == nullptr) fail(ErrorKind::kInternal, "EVP_MD_CTX_new failed");
  reset();
}

Sha256::~Sha256() {
  EVP_MD_CTX_free(impl_->ctx);
}

void Sha256::reset() {
  if (EVP_DigestInit_ex(impl_->ctx, EVP_sha256(), nullptr) != 1)
    fail(ErrorKind::kInternal, "EVP_DigestInit_ex(sha256) failed");
}

void Sha256::update(const void* data, size_t size) {
  if (EVP_DigestUpdate(impl_->ctx, data, size) != 1)
    fail(ErrorKind::kInternal, "EVP_DigestUpdate failed");
}

std::string Sha256::hex_digest() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (EVP_DigestFinal_ex(impl_->ctx, digest, &n) != 1)
    fail(ErrorKind::kInternal, "EVP_DigestFinal_ex failed");
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < n; ++i) {
    out += kHex[digest[i] >> 4];
    out += kHex[digest[i] & 15];
  }
  reset();
  return out;
}

void hash_file_prefix(const std::filesystem::path& file, int64_t size, Sha256& hash) {
  std::ifstream in(file, std::ios::binary);
  if (!in) fail(ErrorKind::kIo, "cannot read {}: {}", file.string(), std::strerror(errno));
  std::vector<char> buf(1 << 20);
  while (size > 0) {
    const auto want = static_cast<std::streamsize>(std::min<int64_t>(size, buf.size()));
    in.read(buf.data(), want);
    if (in.gcount() != want)
      fail(ErrorKind::kIo, "cannot read {}: it ended {} bytes early", file.string(), size);
    hash.update(buf.data(), static_cast<size_t>(want));
    size -= want;
  }
}

}  // namespace dstrain::hub
