// TFRecord framing against a real reference: assets/reference.tfevents was written by
// TensorBoard's own RecordWriter (assets/make_reference_events.py), so its CRCs are TensorFlow's
// masked CRC-32C, not values of ours.

#include "metrics/tfrecord.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "core/error.h"

namespace dstrain::metrics {
namespace {

std::string reference_file() {
  std::ifstream in(
      std::string(DSTRAIN_SOURCE_DIR) + "/tests/unit/metrics/assets/reference.tfevents",
      std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(Crc32c, MatchesTheStandardCheckValue) {
  EXPECT_EQ(crc32c("123456789"), 0xe3069283u);  // the CRC-32C "check" value
  EXPECT_EQ(crc32c(""), 0u);
}

TEST(Crc32c, MaskedValueOfAReferenceHeaderMatchesTensorBoard) {
  const std::string file = reference_file();
  ASSERT_GE(file.size(), 12u);
  // Bytes 8..11 of the file are TensorBoard's masked CRC of bytes 0..7 (the first length).
  uint32_t stored = 0;
  for (int i = 3; i >= 0; --i) stored = (stored << 8) | static_cast<unsigned char>(file[8 + i]);
  EXPECT_EQ(masked_crc32c(std::string_view(file).substr(0, 8)), stored);
}

TEST(TfRecord, ReframingTheReferencePayloadsGivesTheSameBytes) {
  const std::string file = reference_file();
  const std::vector<std::string> payloads = read_tfrecords(file);
  ASSERT_EQ(payloads.size(), 6u);
  std::string again;
  for (const auto& p : payloads) again += tfrecord_frame(p);
  EXPECT_EQ(again, file);
}

TEST(TfRecord, ACorruptedByteIsReportedWithItsRecordOffset) {
  std::string file = reference_file();
  const size_t first = read_tfrecords(file).front().size() + 16;  // start of the second record
  file[first + 20] ^= 0x01;
  try {
    read_tfrecords(file);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("at byte " + std::to_string(first)), std::string::npos)
        << e.what();
  }
}

TEST(TfRecord, ATornLastRecordIsDroppedOnlyWhenAllowed) {
  const std::string file = reference_file();
  const std::string torn = file.substr(0, file.size() - 3);
  EXPECT_THROW(read_tfrecords(torn), Error);
  EXPECT_EQ(read_tfrecords(torn, /*allow_torn_tail=*/true).size(), 5u);
}

}  // namespace
}  // namespace dstrain::metrics
