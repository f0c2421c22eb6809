// data.packing: documents | stream | pad (documents for a new config; true and false, the values of
// records made before the words, read as stream and pad), data.long_documents, TRL's padding_free,
// and training.loss_normalization: tokens for a new config, micro_steps for a run record written
// before the key existed, so that such a run resumes with the loss it had.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "config/config.h"
#include "config_test_util.h"

namespace dstrain::config {
namespace {

using ::testing::HasSubstr;
using testing::minimal_yaml;

Config load(const std::string& yaml, const LoadOptions& options = {}) {
  return load_config_from_string(yaml, "train.yaml", options);
}

TEST(Packing, NewConfigPacksWholeDocumentsAndNormalisesOverTokens) {
  const Config c = load(minimal_yaml());
  EXPECT_EQ(c.data.packing, "documents");
  EXPECT_EQ(c.data.long_documents, "split");
  EXPECT_EQ(c.training.loss_normalization, "tokens");
}

TEST(Packing, WordsAndTheBooleansBeforeThem) {
  for (const auto& [written, value] :
       std::vector<std::pair<std::string, std::string>>{{"documents", "documents"},
                                                        {"Stream", "stream"},
                                                        {"pad", "pad"},
                                                        {"true", "stream"},
                                                        {"false", "pad"}}) {
    EXPECT_EQ(load(minimal_yaml("  packing: " + written + "\n")).data.packing, value) << written;
  }
  const std::string err = testing::load_error(minimal_yaml("  packing: sometimes\n"));
  EXPECT_THAT(err, HasSubstr("data.packing"));
  EXPECT_THAT(err, HasSubstr("documents, stream or pad"));
  EXPECT_THAT(testing::load_error(minimal_yaml("  long_documents: drop\n")),
              HasSubstr("data.long_documents"));
  // Written back as the word, read back the same.
  Config c = load(minimal_yaml("  packing: false\n  long_documents: truncate\n"));
  const Config again = load(to_yaml(c));
  EXPECT_EQ(again.data.packing, "pad");
  EXPECT_EQ(again.data.long_documents, "truncate");
}

TEST(Packing, TrlPaddingFreeMapsToDocuments) {
  EXPECT_EQ(load(minimal_yaml("  padding_free: true\n")).data.packing, "documents");
  EXPECT_THAT(testing::load_error(minimal_yaml("  packing: stream\n  padding_free: true\n")),
              HasSubstr("conflicts with data.packing"));
  EXPECT_EQ(load(minimal_yaml("  padding_free: false\n")).data.packing, "pad");
  const std::string err = testing::load_error(minimal_yaml("  padding_free: documents\n"));
  EXPECT_THAT(err, HasSubstr("data.padding_free"));
  EXPECT_THAT(err, HasSubstr("expected true or false"));
}

TEST(LossNormalization, RecordWrittenBeforeTheKeyKeepsTheMicroStepMean) {
  const std::string record = to_yaml(load(minimal_yaml()));
  const size_t at = record.find("  loss_normalization:");
  ASSERT_NE(at, std::string::npos) << record;
  EXPECT_EQ(load(record).training.loss_normalization, "tokens");
  const std::string old = record.substr(0, at) + record.substr(record.find('\n', at) + 1);
  EXPECT_EQ(load(old).training.loss_normalization, "micro_steps");
  // A run directory's config.yaml: the run plan's comment lines come before the header.
  EXPECT_EQ(load("# micro-batch 8 x accumulation 1\n" + old).training.loss_normalization,
            "micro_steps");
  // Not a record (no header): a new config.
  EXPECT_EQ(load(old.substr(old.find('\n') + 1)).training.loss_normalization, "tokens");
  LoadOptions o;
  o.overrides = {"training.loss_normalization=tokens"};
  EXPECT_EQ(load(old, o).training.loss_normalization, "tokens");
  EXPECT_THAT(testing::load_error(minimal_yaml("training:\n  loss_normalization: samples\n")),
              HasSubstr("tokens, micro_steps"));
}

}  // namespace
}  // namespace dstrain::config
