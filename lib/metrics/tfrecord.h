#pragma once
// TFRecord framing, the container of TensorBoard event files. Each record is
//   uint64 length (little-endian) | uint32 masked_crc32c(length bytes) | data | uint32
//   masked_crc32c(data)
// where masked_crc32c(x) = rotate_right(crc32c(x), 15) + 0xa282ead8 (TensorFlow's masking, so a
// CRC of data that itself holds CRCs stays well distributed). CRC-32C (Castagnoli) comes from
// Intel ISA-L (crc32_iscsi), not from code of ours.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dstrain::metrics {

// CRC-32C of `data` (crc32c("123456789") == 0xe3069283).
uint32_t crc32c(std::string_view data);
uint32_t masked_crc32c(std::string_view data);

// One record holding `payload`, ready to append to a file.
std::string tfrecord_frame(std::string_view payload);

// The payloads of the records in `bytes`, checking both CRCs of each. Error(kInput) naming the
// record's offset on a bad CRC or a truncated record, except that a truncated *last* record (a
// writer killed mid-append) is dropped when `allow_torn_tail` is set, as TensorBoard does.
std::vector<std::string> read_tfrecords(std::string_view bytes, bool allow_torn_tail = false);

}  // namespace dstrain::metrics
