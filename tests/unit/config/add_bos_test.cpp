// data.add_bos: auto | true | false, auto for a new config, and false for a run record (a
// checkpoint's config.yaml) written before the key existed, so that such a run resumes as it ran.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "config/config.h"
#include "config_test_util.h"

namespace dstrain::config {
namespace {

using ::testing::HasSubstr;
using testing::minimal_yaml;

std::string add_bos_of(const std::string& yaml, const LoadOptions& options = {}) {
  return load_config_from_string(yaml, "train.yaml", options).data.add_bos;
}

// `text` without its data.add_bos line.
std::string without_add_bos(const std::string& text) {
  const size_t at = text.find("  add_bos:");
  EXPECT_NE(at, std::string::npos) << text;
  if (at == std::string::npos) return text;
  return text.substr(0, at) + text.substr(text.find('\n', at) + 1);
}

TEST(AddBos, NewConfigDefaultsToAuto) {
  EXPECT_EQ(add_bos_of(minimal_yaml()), "auto");
}

TEST(AddBos, AcceptsAutoTrueFalse) {
  for (const auto& [written, value] :
       std::vector<std::pair<std::string, std::string>>{{"auto", "auto"},
                                                        {"AUTO", "auto"},
                                                        {"true", "true"},
                                                        {"false", "false"},
                                                        {"yes", "true"},
                                                        {"\"false\"", "false"}}) {
    EXPECT_EQ(add_bos_of(minimal_yaml("  add_bos: " + written + "\n")), value) << written;
  }
  const std::string err = testing::load_error(minimal_yaml("  add_bos: sometimes\n"));
  EXPECT_THAT(err, HasSubstr("data.add_bos"));
  EXPECT_THAT(err, HasSubstr("auto, true or false"));
}

TEST(AddBos, RecordWrittenBeforeTheKeyReadsFalse) {
  const std::string record = to_yaml(load_config_from_string(minimal_yaml(), "train.yaml"));
  ASSERT_THAT(record, HasSubstr("add_bos: \"auto\""));
  EXPECT_EQ(add_bos_of(record), "auto");  // a record with the key keeps it
  const std::string old = without_add_bos(record);
  EXPECT_EQ(add_bos_of(old), "false");
  // The same text that is not a run record (no header comment) is a new config.
  EXPECT_EQ(add_bos_of(old.substr(old.find('\n') + 1)), "auto");
  // A value given on the command line still wins.
  LoadOptions o;
  o.overrides = {"data.add_bos=auto"};
  EXPECT_EQ(add_bos_of(old, o), "auto");
}

}  // namespace
}  // namespace dstrain::config
