// Artifact URIs as MLflow's client reads them, and artifacts written into a local artifact root.
// tests/reference/test_mlflow_artifact_root.py checks the same against a real `mlflow server`.

#include "metrics/mlflow_artifacts.h"

#include <sys/stat.h>

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/fs.h"
#include "tests/common/temp_dir.h"

namespace dstrain::metrics {
namespace {

namespace stdfs = std::filesystem;

TEST(MlflowArtifacts, PlainPathsAndFileUrisNameALocalDirectory) {
  EXPECT_EQ(local_artifact_dir("/nfs/mlruns/1/abc/artifacts"), "/nfs/mlruns/1/abc/artifacts");
  EXPECT_EQ(local_artifact_dir("file:///nfs/mlruns/1/abc/artifacts"),
            "/nfs/mlruns/1/abc/artifacts");
  EXPECT_EQ(local_artifact_dir("file:/nfs/mlruns"), "/nfs/mlruns");
  EXPECT_EQ(local_artifact_dir("file://localhost/nfs/mlruns"), "/nfs/mlruns");
  EXPECT_EQ(local_artifact_dir("file:///data/my%20runs/1"), "/data/my runs/1");
  EXPECT_EQ(local_artifact_dir("/data/my%20runs/1"), "/data/my runs/1");  // as url2pathname
}

TEST(MlflowArtifacts, OtherUrisNameNoLocalDirectory) {
  for (const char* uri :
       {"mlflow-artifacts:/1/abc/artifacts", "mlflow-artifacts://host:5000/1/abc/artifacts",
        "s3://bucket/mlruns/1/abc/artifacts", "gs://b/1", "hdfs:/x", "file://otherhost/nfs/x",
        "mlruns/1/abc/artifacts", "./mlruns", ""}) {
    EXPECT_EQ(local_artifact_dir(uri), "") << uri;
  }
  EXPECT_TRUE(is_proxied_artifact_uri("mlflow-artifacts:/1/abc/artifacts"));
  EXPECT_FALSE(is_proxied_artifact_uri("/nfs/mlruns/1/abc/artifacts"));
  EXPECT_FALSE(is_proxied_artifact_uri("file:///nfs/mlruns/1/abc/artifacts"));
}

TEST(MlflowArtifacts, WritesBelowAnExistingRootCreatingTheRunsDirectories) {
  testing::TempDir root;
  const stdfs::path artifacts = root / "7" / "0123abcd" / "artifacts";
  write_local_artifact("file://" + artifacts.string(), "config.yaml", "a: 1\n");
  write_local_artifact(artifacts.string(), "sub/dir/summary.json", "{}");
  EXPECT_EQ(fs::read_file(artifacts / "config.yaml"), "a: 1\n");
  EXPECT_EQ(fs::read_file(artifacts / "sub/dir/summary.json"), "{}");
  write_local_artifact(artifacts.string(), "config.yaml", "a: 2\n");  // replaced, as MLflow does
  EXPECT_EQ(fs::read_file(artifacts / "config.yaml"), "a: 2\n");
  // Readable by others (the tracking server may run as another user), as open() would make it.
  struct stat st {};
  ASSERT_EQ(::stat((artifacts / "config.yaml").c_str(), &st), 0);
  const mode_t mask = ::umask(0);
  ::umask(mask);
  EXPECT_EQ(st.st_mode & 0777, 0644 & ~mask);
  // Nothing but the files themselves: no temporary left behind.
  size_t entries = 0;
  for (auto it = stdfs::directory_iterator(artifacts); it != stdfs::directory_iterator(); ++it) {
    ++entries;
  }
  EXPECT_EQ(entries, 2u);  // config.yaml, sub
}

TEST(MlflowArtifacts, AnUnreachableRootIsAnErrorAndCreatesNothing) {
  testing::TempDir dir;
  const stdfs::path root = dir / "not-mounted" / "mlruns";
  const std::string uri = (root / "1" / "abc" / "artifacts").string();
  try {
    write_local_artifact(uri, "config.yaml", "x");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(e.what()).find("not reachable"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(root.string()), std::string::npos) << e.what();
  }
  EXPECT_FALSE(stdfs::exists(dir / "not-mounted"));
}

TEST(MlflowArtifacts, AnUnsupportedLocationIsAnErrorNamingIt) {
  try {
    write_local_artifact("s3://bucket/1/abc/artifacts", "config.yaml", "x");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(e.what()).find("s3://bucket/1/abc/artifacts"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace dstrain::metrics
