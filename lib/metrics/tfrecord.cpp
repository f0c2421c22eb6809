#include "metrics/tfrecord.h"

#include <isa-l/crc.h>

#include <climits>
#include <cstring>

#include "core/error.h"

namespace dstrain::metrics {
namespace {

constexpr uint32_t kMaskDelta = 0xa282ead8u;
constexpr size_t kHeaderBytes = 12;  // length + its CRC
constexpr size_t kFooterBytes = 4;   // the data's CRC

void put_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

uint64_t get_le(std::string_view in, size_t offset, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) {
    v = (v << 8) | static_cast<unsigned char>(in[offset + static_cast<size_t>(i)]);
  }
  return v;
}

}  // namespace

uint32_t crc32c(std::string_view data) {
  // ISA-L's crc32_iscsi takes the running CRC un-inverted and returns it un-inverted; the standard
  // CRC-32C starts from all ones and inverts the result. Its length is an int: feed large inputs
  // in pieces.
  uint32_t crc = 0xffffffffu;
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  size_t left = data.size();
  while (left > 0) {
    const size_t n = std::min<size_t>(left, INT_MAX / 2);
    crc = crc32_iscsi(const_cast<unsigned char*>(p), static_cast<int>(n), crc);
    p += n;
    left -= n;
  }
  return ~crc;
}

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t crc = crc32c(data);
  return ((crc >> 15) | (crc << 17)) + kMaskDelta;
}

std::string tfrecord_frame(std::string_view payload) {
  std::string out;
  out.reserve(kHeaderBytes + payload.size() + kFooterBytes);
  put_le(out, payload.size(), 8);
  put_le(out, masked_crc32c(out), 4);
  out.append(payload);
  put_le(out, masked_crc32c(payload), 4);
  return out;
}

std::vector<std::string> read_tfrecords(std::string_view bytes, bool allow_torn_tail) {
  std::vector<std::string> records;
  size_t at = 0;
  while (at < bytes.size()) {
    const size_t left = bytes.size() - at;
    const bool has_header = left >= kHeaderBytes;
    if (has_header && get_le(bytes, at + 8, 4) != masked_crc32c(bytes.substr(at, 8))) {
      fail(ErrorKind::kInput, "TFRecord at byte {}: the length's CRC does not match", at);
    }
    const uint64_t length = has_header ? get_le(bytes, at, 8) : 0;
    if (!has_header || left - kHeaderBytes < kFooterBytes ||
        length > left - kHeaderBytes - kFooterBytes) {
      if (allow_torn_tail) break;
      fail(ErrorKind::kInput, "TFRecord at byte {}: truncated ({} bytes left)", at, left);
    }
    const std::string_view data = bytes.substr(at + kHeaderBytes, length);
    if (get_le(bytes, at + kHeaderBytes + length, 4) != masked_crc32c(data)) {
      fail(ErrorKind::kInput, "TFRecord at byte {}: the data's CRC does not match", at);
    }
    records.emplace_back(data);
    at += kHeaderBytes + length + kFooterBytes;
  }
  return records;
}

}  // namespace dstrain::metrics
