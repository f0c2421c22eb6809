// Our Event messages against the ones TensorBoard's Python protos wrote into
// assets/reference.tfevents (same fields, same wall times): equal bytes mean equal field numbers,
// types and encodings, which is what TensorBoard's reader depends on.

#include "metrics/tb_events.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "metrics/tfrecord.h"

namespace dstrain::metrics::tb {
namespace {

std::vector<std::string> reference_events() {
  std::ifstream in(
      std::string(DSTRAIN_SOURCE_DIR) + "/tests/unit/metrics/assets/reference.tfevents",
      std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return read_tfrecords(s.str());
}

class TbEvents : public ::testing::Test {
 protected:
  std::vector<std::string> ref_ = reference_events();
};

TEST_F(TbEvents, FileVersionEventMatchesTensorBoard) {
  ASSERT_EQ(ref_.size(), 6u);
  EXPECT_EQ(file_version_event(1700000000.5), ref_[0]);
}

TEST_F(TbEvents, SessionStartEventMatchesTensorBoard) {
  EXPECT_EQ(session_start_event(1700000000.75, 4), ref_[1]);
}

TEST_F(TbEvents, ScalarsEventMatchesTensorBoard) {
  EXPECT_EQ(scalars_event(1700000001.25, 3, {{"train/loss", 2.5}, {"lr", 0.001}}), ref_[2]);
}

TEST_F(TbEvents, TextEventMatchesTensorBoardsTextPlugin) {
  EXPECT_EQ(text_event(1700000002.0, 0, "config", "model:\n  init: random"), ref_[3]);
}

TEST_F(TbEvents, HparamsSessionStartMatchesTensorBoardsHparamsPlugin) {
  EXPECT_EQ(hparams_start_event(1700000003.0, 0, {{"training.lr", 0.001}}, 1700000000.0), ref_[4]);
}

TEST_F(TbEvents, HparamsSessionEndMatchesTensorBoardsHparamsPlugin) {
  EXPECT_EQ(hparams_end_event(1700000003.0, 0, SessionStatus::kSuccess, 1700000009.0), ref_[5]);
}

TEST(TbEventsHparams, EqualInputsGiveEqualBytesWhateverTheOrder) {
  const std::vector<HParam> a = {{"b", true}, {"a", std::string("x")}, {"c", 1.0}};
  const std::vector<HParam> b = {{"c", 1.0}, {"a", std::string("x")}, {"b", true}};
  EXPECT_EQ(hparams_start_event(1, 0, a, 1), hparams_start_event(1, 0, b, 1));
}

}  // namespace
}  // namespace dstrain::metrics::tb
