#include "data/content_hash.h"

#include <xxhash.h>

#include <fstream>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"

namespace dstrain::data {

struct ContentHash::State {
  XXH3_state_t* xxh = XXH3_createState();
  ~State() { XXH3_freeState(xxh); }
};

ContentHash::ContentHash() : state_(std::make_unique<State>()) {
  if (!state_->xxh) throw std::bad_alloc();
  XXH3_128bits_reset(state_->xxh);
}

ContentHash::~ContentHash() = default;

void ContentHash::update(std::string_view bytes) {
  XXH3_128bits_update(state_->xxh, bytes.data(), bytes.size());
}

std::string ContentHash::hex() const {
  XXH128_canonical_t canonical;
  XXH128_canonicalFromHash(&canonical, XXH3_128bits_digest(state_->xxh));
  std::string out;
  for (unsigned char byte : canonical.digest) out += fmt::format("{:02x}", byte);
  return out;
}

std::string hash_bytes(std::string_view bytes) {
  ContentHash h;
  h.update(bytes);
  return h.hex();
}

std::string hash_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorKind::kIo, "cannot read {} to hash it", path);
  ContentHash h;
  std::vector<char> block(size_t{4} << 20);
  while (in) {
    in.read(block.data(), static_cast<std::streamsize>(block.size()));
    h.update(std::string_view(block.data(), static_cast<size_t>(in.gcount())));
  }
  if (in.bad()) fail(ErrorKind::kIo, "cannot read {} to hash it", path);
  return h.hex();
}

}  // namespace dstrain::data
