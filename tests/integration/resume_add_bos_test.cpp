// data.add_bos and checkpoints made before the key existed. The tokenizer here is a byte-level one
// (as could be used then) whose post-processor puts <s> first, so data.add_bos: auto adds a bos to
// every document and changes the number of samples. A checkpoint whose recorded config.yaml has no
// data.add_bos must resume as it was trained (no bos) with the same losses, not be refused for a
// dataset of another size; the same record with data.add_bos: auto is refused (the check bites).

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/integration/train_util.h"
#include "tokenizer/byte_level.h"

namespace dstrain::testing {
namespace {
namespace stdfs = std::filesystem;
using nlohmann::json;

// 256 byte symbols, "<s>" 256 and "</s>" 257: the tiny model's 258 embedding rows.
void write_tokenizer_with_bos(const std::string& dir) {
  stdfs::create_directories(dir);
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[tokenizer::byte_symbols()[b]] = b;
  vocab["<s>"] = 256;
  vocab["</s>"] = 257;
  const json doc = {
      {"added_tokens",
       {{{"id", 256}, {"content", "<s>"}, {"special", true}, {"normalized", false}},
        {{"id", 257}, {"content", "</s>"}, {"special", true}, {"normalized", false}}}},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single",
         {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
          {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"pair", json::array()},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {256}}, {"tokens", {"<s>"}}}}}}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}}};
  std::ofstream(dir + "/tokenizer.json") << doc.dump();
  std::ofstream(dir + "/tokenizer_config.json") << R"({"bos_token": "<s>", "eos_token": "</s>"})";
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The checkpoint's config.yaml with its data.add_bos line replaced by `line` ("" = removed, as a
// dstrain from before the key wrote it), written to `path`.
void write_recorded_config(const std::string& checkpoint, const std::string& line,
                           const std::string& path) {
  std::istringstream in(read_file(checkpoint + "/config.yaml"));
  std::string out, l;
  int replaced = 0;
  while (std::getline(in, l)) {
    if (l.find("add_bos:") != std::string::npos) {
      ++replaced;
      if (!line.empty()) out += line + "\n";
      continue;
    }
    out += l + "\n";
  }
  ASSERT_EQ(replaced, 1) << "the recorded config has no single add_bos line:\n" << out;
  std::ofstream(path) << out;
}

RunResult resume_with(const TempDir& dir, const std::string& config, const std::string& ckpt) {
  return run_dstrain({"train", config, "--resume-from", ckpt}, {}, 120);
}

TEST(ResumeAddBos, CheckpointFromBeforeTheKeyResumesWithoutBos) {
  TempDir dir;
  write_tokenizer_with_bos(dir.file("tok"));
  JobSpec spec;
  spec.checkpoint_interval = 10;
  spec.extra_overrides = {"model.tokenizer=" + dir.file("tok"), "data.add_bos=false"};
  const RunResult full_run = run_job(dir, spec);
  ASSERT_EQ(full_run.exit_code, 0) << full_run.out << full_run.err;
  const std::map<long, double> full = read_metric(dir.file("run/metrics.jsonl"), "train/loss");
  ASSERT_EQ(full.size(), 20u);
  stdfs::remove(dir.file("run/metrics.jsonl"));
  const std::string ckpt = dir.file("ckpt/step_00000010");

  ASSERT_NO_FATAL_FAILURE(write_recorded_config(ckpt, "", dir.file("old.yaml")));
  const RunResult old = resume_with(dir, dir.file("old.yaml"), ckpt);
  ASSERT_EQ(old.exit_code, 0) << old.out << old.err;
  EXPECT_EQ(old.err.find("each document starts with"), std::string::npos) << old.err;
  const std::map<long, double> resumed = read_metric(dir.file("run/metrics.jsonl"), "train/loss");
  ASSERT_EQ(resumed.size(), 10u);
  expect_same_losses_after(10, resumed, full);
  stdfs::remove(dir.file("run/metrics.jsonl"));

  ASSERT_NO_FATAL_FAILURE(
      write_recorded_config(ckpt, "  add_bos: \"auto\"", dir.file("with_bos.yaml")));
  const RunResult with_bos = resume_with(dir, dir.file("with_bos.yaml"), ckpt);
  EXPECT_EQ(with_bos.exit_code, 2) << with_bos.out << with_bos.err;
  const std::string said = with_bos.out + with_bos.err;
  EXPECT_NE(said.find("each document starts with token 256"), std::string::npos) << said;
  EXPECT_NE(said.find("data.max_length/packing/add_bos changed"), std::string::npos) << said;
}

}  // namespace
}  // namespace dstrain::testing
