// The parallel layouts against what an earlier build did, bit for bit: checkpoints written by it
// (tests/fixtures/layouts, made by its make-fixtures at the commit before the layout was reworked)
// resume to the same losses and export to the same bytes, and the demo config's first losses at
// each layout are the ones it logged. A change that moves any of them by one bit fails here.

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "hub/sha256.h"
#include "tests/integration/process_util.h"
#include "tests/integration/train_util.h"

namespace dstrain::testing {
namespace {

namespace stdfs = std::filesystem;

const std::string kFixtures = std::string(DSTRAIN_SOURCE_DIR) + "/tests/fixtures/layouts";
const std::string kCorpus = std::string(DSTRAIN_SOURCE_DIR) + "/configs/data/tiny_corpus.txt";

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return nlohmann::json::parse(in);
}

std::vector<std::string> with_sets(std::vector<std::string> args, const nlohmann::json& sets) {
  for (const auto& word : sets) args.push_back(word.get<std::string>());
  return args;
}

// Every logged loss of `metrics` by step, exactly as written.
std::map<std::string, double> losses(const std::string& metrics) {
  std::map<std::string, double> out;
  for (const auto& [step, loss] : read_metric(metrics, "train/loss")) {
    out[std::to_string(step)] = loss;
  }
  return out;
}

std::string file_sha256(const std::string& path) {
  hub::Sha256 h;
  hub::hash_file_prefix(path, static_cast<int64_t>(stdfs::file_size(path)), h);
  return h.hex_digest();
}

class LayoutFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(LayoutFixture, ResumesToTheSameLossesAndExportsTheSameBytes) {
  const std::string dir = kFixtures + "/" + GetParam();
  const nlohmann::json want = read_json(dir + "/expected.json");
  TempDir tmp;
  // A copy: nothing is written next to the fixture.
  stdfs::copy(dir + "/ckpt", tmp.file("ckpt"), stdfs::copy_options::recursive);
  const std::string nproc = std::to_string(want.at("nproc").get<int>());
  const RunResult r = run_dstrain(
      {"resume", tmp.file("ckpt"), "--nproc", nproc, "--set",
       "model.name_or_path=" + kFixtures + "/model", "--set", "data.train_path=" + kCorpus, "--set",
       "logging.out_dir=" + tmp.file("run"), "--set", "checkpoint.dir=" + tmp.file("run/ckpt")},
      {}, 180);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::map<std::string, double> got = losses(tmp.file("run/metrics.jsonl"));
  EXPECT_EQ(got, want.at("resumed").get<decltype(got)>());
  // Resumed = uninterrupted, for each step after the checkpoint.
  for (const auto& [step, loss] : got) {
    EXPECT_EQ(loss, want.at("losses").at(step).get<double>()) << "step " << step;
  }
  // "plain" for `dstrain export`, else the flag (a LoRA checkpoint's --adapter-only, --merge-lora).
  for (const auto& [flag, want_sums] : want.at("export_sha256").items()) {
    std::vector<std::string> args = {"export", tmp.file("ckpt"), "--out", tmp.file(flag)};
    if (flag != "plain") args.push_back(flag);
    const RunResult e = run_dstrain(args, {}, 60);
    ASSERT_EQ(e.exit_code, 0) << e.out << e.err;
    std::map<std::string, std::string> sums;
    for (const auto& entry : stdfs::directory_iterator(tmp.file(flag))) {
      sums[entry.path().filename().string()] = file_sha256(entry.path().string());
    }
    EXPECT_EQ(sums, (want_sums.get<std::map<std::string, std::string>>())) << flag;
  }
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, LayoutFixture,
                         ::testing::Values("one_rank", "zero3", "tp2", "pp2", "lora"),
                         [](const auto& info) { return info.param; });

std::vector<std::string> curve_names() {
  std::vector<std::string> names;
  std::ifstream in(kFixtures + "/curves.json");
  if (!in.good()) return names;
  const nlohmann::json curves = nlohmann::json::parse(in);
  for (auto it = curves.begin(); it != curves.end(); ++it) names.push_back(it.key());
  return names;
}

class LayoutCurve : public ::testing::TestWithParam<std::string> {};

TEST_P(LayoutCurve, TheDemoConfigsFirstLossesAreTheRecordedOnes) {
  const nlohmann::json want = read_json(kFixtures + "/curves.json").at(GetParam());
  TempDir tmp;
  const std::vector<std::string> args =
      with_sets({"launch",
                 "--nproc",
                 std::to_string(want.at("nproc").get<int>()),
                 std::string(DSTRAIN_SOURCE_DIR) + "/configs/tiny.yaml",
                 "--set",
                 "data.train_path=" + kCorpus,
                 "--set",
                 "model.name_or_path=" + std::string(DSTRAIN_SOURCE_DIR) + "/configs/models/tiny",
                 "--set",
                 "training.max_steps=5",
                 "--set",
                 "training.log_interval=1",
                 "--set",
                 "training.eval_interval=0",
                 "--set",
                 "checkpoint.interval=0",
                 "--set",
                 "checkpoint.save_final=false",
                 "--set",
                 "logging.out_dir=" + tmp.path()},
                want.at("overrides"));
  const RunResult r = run_dstrain(args, {}, 180);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  std::vector<double> got;
  for (const auto& [step, loss] : read_metric(tmp.file("metrics.jsonl"), "train/loss")) {
    got.push_back(loss);
  }
  EXPECT_EQ(got, want.at("losses").get<std::vector<double>>());
}

INSTANTIATE_TEST_SUITE_P(Layouts, LayoutCurve, ::testing::ValuesIn(curve_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace dstrain::testing
