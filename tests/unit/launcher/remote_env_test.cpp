#include "launcher/remote_env.h"

#include <unistd.h>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "core/error.h"

namespace dstrain::launcher {
namespace {

namespace fs = std::filesystem;

TEST(RemoteEnv, ForwardsOnlyKnownPrefixes) {
  const char* environ[] = {"NCCL_DEBUG=INFO",
                           "DSTRAIN_X=1",
                           "MLFLOW_TRACKING_URI=http://m",
                           "WANDB_MODE=off",
                           "HF_HOME=/h",
                           "CUDA_LAUNCH_BLOCKING=1",
                           "OMP_NUM_THREADS=4",
                           "UCX_TLS=rc",
                           "FI_PROVIDER=efa",
                           "PATH=/bin",
                           "HOME=/root",
                           "NCCLX=no",
                           "MY_NCCL_Y=no",
                           "PYTHONPATH=/p",
                           "GLOO_SOCKET_IFNAME=eth1",
                           nullptr};
  EnvList env = forwarded_variables(environ);
  std::vector<std::string> names;
  for (const auto& kv : env) names.push_back(kv.first);
  EXPECT_EQ(names,
            (std::vector<std::string>{"CUDA_LAUNCH_BLOCKING", "DSTRAIN_X", "FI_PROVIDER",
                                      "GLOO_SOCKET_IFNAME", "HF_HOME", "MLFLOW_TRACKING_URI",
                                      "NCCL_DEBUG", "OMP_NUM_THREADS", "UCX_TLS", "WANDB_MODE"}));
}

TEST(RemoteEnv, EnvFileAllowsCommentsBlankLinesAndLiteralValues) {
  EnvList env = parse_env_file(
      "# comment\n\nNCCL_IB_HCA=mlx5_0,mlx5_1\n   # indented comment\nX=a b # not a comment\n"
      "EMPTY=\nQ='quoted'\r\nX=second\n",
      "f");
  EXPECT_EQ(
      env,
      (EnvList{
          {"NCCL_IB_HCA", "mlx5_0,mlx5_1"}, {"X", "second"}, {"EMPTY", ""}, {"Q", "'quoted'"}}));
}

TEST(RemoteEnv, MalformedEnvFileLineNamesFileAndLine) {
  for (const char* bad : {"A=1\nno equals sign\n", "A=1\n=value\n", "A=1\n1X=2\n",
                          "A=1\nexport B=2\n", "A=1\nA B=3\n"}) {
    try {
      parse_env_file(bad, "/home/u/.dstrain_env");
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInput);
      EXPECT_NE(std::string(e.what()).find("/home/u/.dstrain_env:2"), std::string::npos)
          << e.what();
    }
  }
}

TEST(RemoteEnv, EnvFlagNeedsKeyValue) {
  EXPECT_EQ(parse_env_flag("K=a=b"), (std::pair<std::string, std::string>{"K", "a=b"}));
  EXPECT_THROW(parse_env_flag("novalue"), Error);
  EXPECT_THROW(parse_env_flag("=x"), Error);
}

TEST(RemoteEnv, LaterSourcesWin) {
  std::string pattern = fs::temp_directory_path().string() + "/dstrain_env_XXXXXX";
  std::string root = ::mkdtemp(pattern.data());
  fs::create_directories(root + "/home");
  fs::create_directories(root + "/cwd");
  std::ofstream(root + "/home/.dstrain_env") << "NCCL_DEBUG=WARN\nA=home\nB=home\n";
  std::ofstream(root + "/cwd/.dstrain_env") << "B=cwd\nC=cwd\n";
  const char* environ[] = {"NCCL_DEBUG=INFO", "NCCL_ALGO=Ring", nullptr};
  RemoteEnvSources sources;
  sources.environ = environ;
  sources.home = root + "/home";
  sources.cwd = root + "/cwd";
  sources.flags = {"C=flag", "D=flag"};
  EnvList env = collect_remote_env(sources);
  fs::remove_all(root);
  EXPECT_EQ(env, (EnvList{{"NCCL_ALGO", "Ring"},
                          {"NCCL_DEBUG", "WARN"},
                          {"A", "home"},
                          {"B", "cwd"},
                          {"C", "flag"},
                          {"D", "flag"}}));
}

}  // namespace
}  // namespace dstrain::launcher
