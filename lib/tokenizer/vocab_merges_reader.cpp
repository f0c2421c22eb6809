#include "tokenizer/vocab_merges_reader.h"

#include <fmt/format.h>

#include "core/error.h"
#include "core/fs.h"
#include "tokenizer/json_file.h"
#include "tokenizer/special_tokens.h"
#include "tokenizer/split_regex.h"

namespace dstrain::tokenizer {
namespace {

namespace stdfs = std::filesystem;

void read_vocab(const stdfs::path& path, BpeSpec& spec) {
  spec.vocab_origin = path.string();
  const nlohmann::json vocab = read_json_file(path);
  expect_object(vocab, spec.vocab_origin + " (expected {token: id, ...})");
  spec.vocab.reserve(vocab.size());
  for (const auto& [token, id] : vocab.items()) {
    spec.vocab.emplace(token, expect_id(id, spec.vocab_origin + ": \"" + token + "\""));
  }
}

// merges.txt: an optional "#version" first line, then one "left right" pair per line.
void read_merges(const stdfs::path& path, BpeSpec& spec) {
  const std::string text = fs::read_file(path);
  std::vector<int> lines;  // file line of each merge, for errors
  size_t pos = 0;
  for (int line_no = 1; pos < text.size(); ++line_no) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.substr(0, 8) == "#version")) continue;
    const size_t space = line.find(' ');
    if (space == 0 || space == std::string_view::npos || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string_view::npos) {
      fail(ErrorKind::kInput, "{} line {}: expected two tokens separated by one space, got '{}'",
           path.string(), line_no, line);
    }
    spec.merges.emplace_back(std::string(line.substr(0, space)),
                             std::string(line.substr(space + 1)));
    lines.push_back(line_no);
  }
  spec.merge_origin = [file = path.string(), lines = std::move(lines)](size_t i) {
    return fmt::format("{} line {}", file, lines[i]);
  };
}

bool is_qwen2_family(const stdfs::path& dir) {
  const stdfs::path config = dir / "tokenizer_config.json";
  if (!stdfs::exists(config)) return false;
  const nlohmann::json cfg = read_json_file(config);
  if (!cfg.is_object() || !cfg.contains("tokenizer_class")) return false;
  const std::string cls =
      expect_string(cfg["tokenizer_class"], config.string() + ": tokenizer_class");
  return cls.rfind("Qwen2Tokenizer", 0) == 0;
}

// tokenizer_config.json's add_bos_token: without a tokenizer.json, transformers builds the
// post-processor from it (with one, the file's post_processor is used and this key is not).
bool adds_bos(const stdfs::path& dir) {
  const stdfs::path config = dir / "tokenizer_config.json";
  if (!stdfs::exists(config)) return false;
  const nlohmann::json cfg = read_json_file(config);
  return cfg.is_object() && cfg.value("add_bos_token", nlohmann::json(false)) == true;
}

}  // namespace

BpeSpec read_vocab_merges(const stdfs::path& dir, const std::string& vocab_name,
                          const std::string& merges_name) {
  BpeSpec spec;
  read_vocab(dir / vocab_name, spec);
  read_merges(dir / merges_name, spec);
  const bool qwen2 = is_qwen2_family(dir);
  spec.split_pattern = qwen2 ? kQwen2SplitPattern : kGpt2SplitPattern;
  spec.split_origin = qwen2 ? "built-in Qwen2 split regex" : "built-in GPT-2 split regex";
  if (qwen2) spec.normalizer.push_back({NormalizerStep::Kind::kNfc, "", ""});
  read_special_tokens(dir, spec);
  if (spec.bos && adds_bos(dir)) spec.post_processor_prefix = {*spec.bos};
  return spec;
}

}  // namespace dstrain::tokenizer
