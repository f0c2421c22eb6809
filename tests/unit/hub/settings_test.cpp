#include "hub/settings.h"

#include <gtest/gtest.h>

#include "hub_test_util.h"

namespace dstrain::hub {
namespace {

namespace stdfs = std::filesystem;
using testing::ScopedEnv;
using testing::TempDir;

// Clears every variable settings_from_env reads, so a test sees only what it sets.
struct CleanEnv {
  ScopedEnv vars[13] = {{"HF_HUB_CACHE", nullptr},
                        {"HUGGINGFACE_HUB_CACHE", nullptr},
                        {"HF_HOME", nullptr},
                        {"XDG_CACHE_HOME", nullptr},
                        {"HF_ENDPOINT", nullptr},
                        {"HF_TOKEN", nullptr},
                        {"HUGGING_FACE_HUB_TOKEN", nullptr},
                        {"HF_TOKEN_PATH", nullptr},
                        {"HF_HUB_OFFLINE", nullptr},
                        {"TRANSFORMERS_OFFLINE", nullptr},
                        {"HF_HUB_ETAG_TIMEOUT", nullptr},
                        {"HF_HUB_DOWNLOAD_TIMEOUT", nullptr},
                        {"HOME", "/home/someone"}};
};

TEST(HubSettings, DefaultsAreHuggingFaceHubs) {
  CleanEnv clean;
  const HubSettings s = settings_from_env();
  EXPECT_EQ(s.endpoint, "https://huggingface.co");
  EXPECT_EQ(s.cache_dir, stdfs::path("/home/someone/.cache/huggingface/hub"));
  EXPECT_FALSE(s.offline);
  EXPECT_EQ(s.metadata_timeout_s, 10);
  EXPECT_EQ(s.download_timeout_s, 10);
}

TEST(HubSettings, CacheRootPrecedence) {
  CleanEnv clean;
  ScopedEnv xdg("XDG_CACHE_HOME", "/xdg");
  EXPECT_EQ(hub_cache_dir(), stdfs::path("/xdg/huggingface/hub"));
  ScopedEnv home("HF_HOME", "~/hf");
  EXPECT_EQ(hub_cache_dir(), stdfs::path("/home/someone/hf/hub"));
  ScopedEnv legacy("HUGGINGFACE_HUB_CACHE", "/legacy");
  EXPECT_EQ(hub_cache_dir(), stdfs::path("/legacy"));
  ScopedEnv cache("HF_HUB_CACHE", "/cache");
  EXPECT_EQ(hub_cache_dir(), stdfs::path("/cache"));
}

TEST(HubSettings, EndpointLosesTrailingSlash) {
  CleanEnv clean;
  ScopedEnv endpoint("HF_ENDPOINT", "http://127.0.0.1:8080/");
  EXPECT_EQ(settings_from_env().endpoint, "http://127.0.0.1:8080");
}

TEST(HubSettings, TokenFromEnvironmentBeforeTokenFile) {
  CleanEnv clean;
  TempDir home;
  ScopedEnv hf_home("HF_HOME", home.path().c_str());
  testing::write(home / "token", "hf_from_file\n");
  EXPECT_EQ(settings_from_env().token, "hf_from_file");
  EXPECT_EQ(settings_from_env().token_source, (home / "token").string());
  ScopedEnv legacy("HUGGING_FACE_HUB_TOKEN", "hf_legacy");
  EXPECT_EQ(settings_from_env().token, "hf_legacy");
  ScopedEnv token("HF_TOKEN", " hf_env\r\n");
  EXPECT_EQ(settings_from_env().token, "hf_env");
  EXPECT_EQ(settings_from_env().token_source, "HF_TOKEN");
}

TEST(HubSettings, TokenPathOverridesTheFileUnderHfHome) {
  CleanEnv clean;
  TempDir dir;
  testing::write(dir / "elsewhere", "hf_elsewhere");
  ScopedEnv path("HF_TOKEN_PATH", (dir / "elsewhere").c_str());
  EXPECT_EQ(settings_from_env().token, "hf_elsewhere");
}

TEST(HubSettings, NoTokenAnywhereIsEmpty) {
  CleanEnv clean;
  TempDir home;
  ScopedEnv hf_home("HF_HOME", home.path().c_str());
  EXPECT_EQ(settings_from_env().token, "");
  EXPECT_EQ(settings_from_env().token_source, "");
}

TEST(HubSettings, OfflineTakesHuggingFaceTruthValues) {
  CleanEnv clean;
  for (const char* v : {"1", "true", "YES", "on"}) {
    ScopedEnv offline("HF_HUB_OFFLINE", v);
    EXPECT_TRUE(settings_from_env().offline) << v;
  }
  ScopedEnv transformers("TRANSFORMERS_OFFLINE", "1");
  EXPECT_TRUE(settings_from_env().offline);
  ScopedEnv off("HF_HUB_OFFLINE", "0");  // set: TRANSFORMERS_OFFLINE is not consulted
  EXPECT_FALSE(settings_from_env().offline);
}

TEST(HubSettings, BadTimeoutIsConfigError) {
  CleanEnv clean;
  ScopedEnv t("HF_HUB_DOWNLOAD_TIMEOUT", "soon");
  testing::expect_error([] { settings_from_env(); }, ErrorKind::kConfig,
                        {"HF_HUB_DOWNLOAD_TIMEOUT", "soon"});
}

}  // namespace
}  // namespace dstrain::hub
