#include "core/secrets.h"

#include <gtest/gtest.h>

namespace dstrain::secrets {
namespace {

// The registry is process-wide and only grows: every test uses values and names of its own.

TEST(Secrets, NamesWithAMarkerInAnyCaseAreSecret) {
  for (const char* name :
       {"HF_TOKEN", "MLFLOW_TRACKING_TOKEN", "AWS_SECRET_ACCESS_KEY", "MLFLOW_TRACKING_PASSWORD",
        "WANDB_API_KEY", "GOOGLE_CREDENTIALS", "my_api_key", "Hf_Token"}) {
    EXPECT_TRUE(is_secret_name(name)) << name;
  }
  for (const char* name : {"HF_HOME", "MASTER_ADDR", "NCCL_DEBUG", "DSTRAIN_REDACT_VARS", "PATH"})
    EXPECT_FALSE(is_secret_name(name)) << name;
}

TEST(Secrets, NamedVariablesAreSecretByExactName) {
  EXPECT_FALSE(is_secret_name("NAMED_PROBE_A"));
  add_secret_names({"NAMED_PROBE_A"});
  EXPECT_TRUE(is_secret_name("NAMED_PROBE_A"));
  EXPECT_FALSE(is_secret_name("NAMED_PROBE_AB"));
  EXPECT_FALSE(is_secret_name("named_probe_a"));
}

TEST(Secrets, LearnsValuesOfSecretVariablesAndNamesFromTheEnvironment) {
  const char* env[] = {
      "HF_TOKEN=hf_learned_value_1", "HF_HOME=/not/secret/home", "DSTRAIN_REDACT_VARS=PROBE_X,",
      "PROBE_X=listed-by-name-2",    "ANOTHER_KEY=short",        nullptr};
  learn_environment(env);
  EXPECT_TRUE(is_secret_name("PROBE_X"));
  EXPECT_EQ(redact("a hf_learned_value_1 b listed-by-name-2 c /not/secret/home short"),
            "a <redacted> b <redacted> c /not/secret/home short");
}

TEST(Secrets, RedactReplacesEveryOccurrenceLongestFirst) {
  add_secret_value("overlap-secret");
  add_secret_value("overlap-secret-longer");
  EXPECT_EQ(redact("overlap-secret-longer|overlap-secretoverlap-secret"),
            "<redacted>|<redacted><redacted>");
  EXPECT_EQ(redact("nothing here"), "nothing here");
}

TEST(Secrets, ShortValuesAreNotSearchedButStillShownRedactedByName) {
  add_secret_value("abc");
  EXPECT_EQ(redact("abc abc"), "abc abc");
  EXPECT_EQ(shown_value("SOME_TOKEN", "abc"), kRedacted);
  EXPECT_EQ(shown_value("SOME_PATH", "abc"), "abc");
}

TEST(Secrets, NameListsRoundTrip) {
  EXPECT_EQ(join_names({"A", "B_C"}), "A,B_C");
  EXPECT_EQ(split_names("A,,B_C,"), (std::vector<std::string>{"A", "B_C"}));
  EXPECT_TRUE(split_names("").empty());
}

TEST(Secrets, StreamFindsASecretSplitAcrossPieces) {
  add_secret_value("split-across-pieces");
  const std::string text = "before split-across-pieces after; split-acr stays";
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    StreamRedactor stream;
    std::string out = stream.feed(text.substr(0, cut));
    out += stream.feed(text.substr(cut));
    out += stream.finish();
    EXPECT_EQ(out, "before <redacted> after; split-acr stays") << "cut at " << cut;
  }
}

TEST(Secrets, StreamHoldsBackOnlyWhatMayStartASecret) {
  add_secret_value("held-back-secret");
  StreamRedactor stream;
  EXPECT_EQ(stream.feed("line one\nheld-"), "line one\n");
  EXPECT_EQ(stream.feed("back-value\n"), "held-back-value\n");
  EXPECT_EQ(stream.feed("tail held-back"), "tail ");
  EXPECT_EQ(stream.finish(), "held-back");
}

}  // namespace
}  // namespace dstrain::secrets
