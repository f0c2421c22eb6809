// The exit codes docs/config.md documents ("Exit codes"), against the code and against the real
// binary: each refused input class is provoked and must exit with the documented code, and the
// pages that name a code for one case (docs/lora.md's `bias`) must name the same.

#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "tests/integration/train_util.h"

namespace dstrain::testing {
namespace {

// kind name as the docs write it ("kConfig") -> the documented exit code.
std::map<std::string, int> documented_codes() {
  std::istringstream doc(read_text(DSTRAIN_SOURCE_DIR "/docs/config.md"));
  std::map<std::string, int> codes;
  bool in_section = false;
  static const std::regex row(R"(^\| (\d+) \|.*\|(.*)\|$)");
  static const std::regex kind("`(k[A-Za-z]+)`");
  std::string line;
  while (std::getline(doc, line)) {
    if (line.rfind("## ", 0) == 0) in_section = line == "## Exit codes";
    std::smatch m;
    if (!in_section || !std::regex_match(line, m, row)) continue;
    const int code = std::stoi(m[1]);
    const std::string kinds = m[2];
    for (std::sregex_iterator it(kinds.begin(), kinds.end(), kind), e; it != e; ++it) {
      EXPECT_EQ(codes.count((*it)[1]), 0u) << (*it)[1] << " documented twice";
      codes[(*it)[1]] = code;
    }
  }
  return codes;
}

int documented(const std::string& kind) {
  const auto codes = documented_codes();
  const auto it = codes.find(kind);
  EXPECT_NE(it, codes.end()) << kind << " has no row in docs/config.md's exit codes";
  return it == codes.end() ? -1 : it->second;
}

TEST(ExitCodes, TheDocumentedTableIsTheCodesMapping) {
  const std::vector<std::pair<ErrorKind, std::string>> kinds = {
      {ErrorKind::kUsage, "kUsage"},      {ErrorKind::kConfig, "kConfig"},
      {ErrorKind::kInput, "kInput"},      {ErrorKind::kIo, "kIo"},
      {ErrorKind::kComm, "kComm"},        {ErrorKind::kTimeout, "kTimeout"},
      {ErrorKind::kRuntime, "kRuntime"},  {ErrorKind::kNotImplemented, "kNotImplemented"},
      {ErrorKind::kInternal, "kInternal"}};
  const auto codes = documented_codes();
  EXPECT_EQ(codes.size(), kinds.size());
  for (const auto& [kind, name] : kinds) {
    EXPECT_EQ(documented(name), exit_code(kind)) << name;
  }
}

// A run of the tiny model that stops at once, with `sets` as --set overrides.
std::vector<std::string> train_args(const std::string& config, std::vector<std::string> sets) {
  std::vector<std::string> args = {"train", config, "--set", "training.max_steps=1"};
  for (const auto& s : sets) {
    args.push_back("--set");
    args.push_back(s);
  }
  return args;
}

void expect_exit(const std::vector<std::string>& args, int code, const std::string& says) {
  std::string command = "dstrain";
  for (const auto& a : args) command += " " + a;
  const RunResult r = run_dstrain(args, {"DSTRAIN_DEVICE=cpu"}, 120);
  ASSERT_FALSE(r.timed_out) << command;
  EXPECT_EQ(r.exit_code, code) << command << "\n" << r.out << r.err;
  EXPECT_NE((r.out + r.err).find(says), std::string::npos) << command << "\n" << r.out << r.err;
}

TEST(ExitCodes, BadCommandLinesExitAsDocumented) {
  expect_exit({"train"}, documented("kUsage"), "CONFIG is required");
  expect_exit({"launch", "--no-such-flag", "x.yaml"}, documented("kUsage"), "--no-such-flag");
}

TEST(ExitCodes, ABadMemoryFractionIsAUsageErrorNamingTheVariable) {
  TempDir dir;
  const std::string cfg = write_job_config(dir.path(), JobSpec{});
  const RunResult r = run_dstrain(train_args(cfg, {}),
                                  {"DSTRAIN_DEVICE=cpu", "DSTRAIN_CUDA_MEMORY_FRACTION=1.5"}, 120);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, documented("kUsage")) << r.out << r.err;
  EXPECT_NE((r.out + r.err).find("DSTRAIN_CUDA_MEMORY_FRACTION='1.5'"), std::string::npos)
      << r.out << r.err;
}

TEST(ExitCodes, RefusedConfigsExitAsDocumentedIncludingLoraBias) {
  TempDir dir;
  const std::string cfg = write_job_config(dir.path(), JobSpec{});
  const int code = documented("kConfig");
  expect_exit(train_args(cfg, {"lora.enabled=true", "lora.bias=all"}), code, "lora.bias");
  expect_exit(train_args(cfg, {"lora.enabled=true", "lora.bias=lora_only"}), code, "lora.bias");
  expect_exit(train_args(cfg, {"training.lrr=1"}), code, "did you mean training.lr");
  expect_exit({"launch", "--nproc", "2", cfg, "--set", "zero.stage=7"}, code, "zero.stage");
  // The pages that give lora.bias's code name the same one.
  static const std::regex exit_code_text(R"(exit(?: code)? (\d+))");
  for (const auto& [page, row] : std::vector<std::pair<std::string, std::string>>{
           {"docs/lora.md", "| `bias` |"}, {"docs/config.md", "| `lora.bias` |"}}) {
    std::istringstream text(read_text(DSTRAIN_SOURCE_DIR "/" + page));
    std::string line;
    bool found = false;
    while (std::getline(text, line)) {
      std::smatch m;
      if (line.rfind(row, 0) != 0 || !std::regex_search(line, m, exit_code_text)) continue;
      found = true;
      EXPECT_EQ(std::stoi(m[1]), code) << page << ": " << line;
    }
    EXPECT_TRUE(found) << page << " gives no exit code for lora bias";
  }
}

TEST(ExitCodes, BadInputFilesExitAsDocumented) {
  TempDir dir;
  const std::string cfg = write_job_config(dir.path(), JobSpec{});
  const int code = documented("kInput");
  expect_exit(train_args(cfg, {"data.train_path=" + dir.file("absent/*.txt")}), code,
              "no file matches");
  std::ofstream(dir.file("hosts")) << "worker-1 slots=2\nworker-1 slots=2\n";
  expect_exit({"launch", "--hostfile", dir.file("hosts"), "--dry-run", cfg}, code,
              "duplicate host");
  expect_exit({"ckpt", "verify", dir.path()}, code, dir.path());
}

TEST(ExitCodes, FailedRunsExitAsDocumented) {
  TempDir dir;
  const std::string cfg = write_job_config(dir.path(), JobSpec{});
  expect_exit(train_args(cfg, {"logging.out_dir=/dev/null/run"}), documented("kIo"), "/dev/null");
  // A learning rate this large makes the loss NaN within a few steps.
  expect_exit(train_args(cfg, {"training.max_steps=50", "training.lr=1e4"}), documented("kRuntime"),
              "diverged");
}

}  // namespace
}  // namespace dstrain::testing
