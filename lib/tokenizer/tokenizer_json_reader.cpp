#include "tokenizer/tokenizer_json_reader.h"

#include <fmt/format.h>

#include "core/error.h"
#include "tokenizer/json_file.h"
#include "tokenizer/special_tokens.h"
#include "tokenizer/split_regex.h"

namespace dstrain::tokenizer {
namespace {

using nlohmann::json;

[[noreturn]] void unsupported(const std::string& origin, const std::string& what) {
  fail(ErrorKind::kInput, "{}: {} is not supported (expected a byte-level BPE tokenizer)", origin,
       what);
}

std::pair<std::string, std::string> read_merge(const json& m, const std::string& origin) {
  if (m.is_array() && m.size() == 2) {
    return {expect_string(m[0], origin), expect_string(m[1], origin)};
  }
  const std::string& s = expect_string(m, origin + " (a \"left right\" string or a pair)");
  const size_t space = s.find(' ');
  if (space == 0 || space == std::string::npos || space + 1 == s.size() ||
      s.find(' ', space + 1) != std::string::npos) {
    fail(ErrorKind::kInput, "{}: expected two tokens separated by one space, got '{}'", origin, s);
  }
  return {s.substr(0, space), s.substr(space + 1)};
}

void read_model(const json& model, const std::string& file, BpeSpec& spec) {
  const std::string origin = file + ": model";
  expect_object(model, origin);
  const std::string type =
      model.contains("type") ? expect_string(model["type"], origin + ".type") : "BPE";
  if (type != "BPE") unsupported(origin + ".type", "model type '" + type + "'");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && !model[key].is_null() && model[key] != "") {
      unsupported(origin + "." + key, "a non-empty " + std::string(key));
    }
  }
  spec.vocab_origin = origin + ".vocab";
  const json vocab = model.value("vocab", json());
  for (const auto& [token, id] : expect_object(vocab, spec.vocab_origin).items()) {
    spec.vocab.emplace(token, expect_id(id, spec.vocab_origin + ": \"" + token + "\""));
  }
  const json merges = model.value("merges", json::array());
  for (size_t i = 0; i < expect_array(merges, origin + ".merges").size(); ++i) {
    spec.merges.push_back(read_merge(merges[i], fmt::format("{}.merges[{}]", origin, i)));
  }
  spec.merge_origin = [origin](size_t i) { return fmt::format("{}.merges[{}]", origin, i); };
  spec.ignore_merges = model.value("ignore_merges", false);
}

void read_added(const json& added, const std::string& file, BpeSpec& spec) {
  if (added.is_null()) return;
  for (size_t i = 0; i < expect_array(added, file + ": added_tokens").size(); ++i) {
    const std::string where = fmt::format("{}: added_tokens[{}]", file, i);
    const json& t = expect_object(added[i], where);
    spec.added.push_back({expect_string(t.value("content", json()), where + ".content"),
                          expect_id(t.value("id", json()), where + ".id"),
                          t.value("special", false)});
  }
}

void read_normalizer(const json& n, const std::string& origin, BpeSpec& spec) {
  if (n.is_null()) return;
  const std::string type =
      expect_string(expect_object(n, origin).value("type", json()), origin + ".type");
  if (type == "NFC") {
    spec.nfc = true;
  } else if (type == "Sequence") {
    const json list = n.value("normalizers", json::array());
    for (size_t i = 0; i < expect_array(list, origin + ".normalizers").size(); ++i) {
      read_normalizer(list[i], fmt::format("{}.normalizers[{}]", origin, i), spec);
    }
  } else {
    unsupported(origin, "normalizer '" + type + "'");
  }
}

void read_split(const json& p, const std::string& origin, BpeSpec& spec) {
  if (p.value("behavior", std::string("Isolated")) != "Isolated" || p.value("invert", false)) {
    unsupported(origin, "a Split other than behavior Isolated, invert false");
  }
  const json pattern = p.value("pattern", json());
  expect_object(pattern, origin + ".pattern");
  spec.split_literal = !pattern.contains("Regex");
  spec.split_pattern = expect_string(pattern.value(spec.split_literal ? "String" : "Regex", json()),
                                     origin + ".pattern (Regex or String)");
  spec.split_origin = origin + ".pattern";
}

void read_pre_tokenizer(const json& p, const std::string& origin, BpeSpec& spec, bool& byte_level) {
  const std::string type =
      expect_string(expect_object(p, origin).value("type", json()), origin + ".type");
  if (type == "Sequence") {
    const json list = p.value("pretokenizers", json::array());
    for (size_t i = 0; i < expect_array(list, origin + ".pretokenizers").size(); ++i) {
      read_pre_tokenizer(list[i], fmt::format("{}.pretokenizers[{}]", origin, i), spec, byte_level);
    }
  } else if (type == "Split") {
    if (!spec.split_pattern.empty()) unsupported(origin, "more than one split regex");
    read_split(p, origin, spec);
  } else if (type == "ByteLevel") {
    if (p.value("add_prefix_space", false)) unsupported(origin, "add_prefix_space: true");
    if (p.value("use_regex", true)) {
      if (!spec.split_pattern.empty()) unsupported(origin, "more than one split regex");
      spec.split_pattern = kGpt2SplitPattern;
      spec.split_origin = origin + " (GPT-2 regex)";
    }
    byte_level = true;
  } else {
    unsupported(origin, "pre-tokenizer '" + type + "'");
  }
}

}  // namespace

BpeSpec read_tokenizer_json(const std::filesystem::path& file) {
  const std::string name = file.string();
  const json doc = expect_object(read_json_file(file), name);
  BpeSpec spec;
  read_model(doc.value("model", json()), name, spec);
  read_added(doc.value("added_tokens", json()), name, spec);
  read_normalizer(doc.value("normalizer", json()), name + ": normalizer", spec);
  bool byte_level = false;
  const json pre = doc.value("pre_tokenizer", json());
  if (!pre.is_null()) read_pre_tokenizer(pre, name + ": pre_tokenizer", spec, byte_level);
  if (!byte_level) unsupported(name + ": pre_tokenizer", "a pre-tokenizer without ByteLevel");
  if (spec.split_pattern.empty())
    unsupported(name + ": pre_tokenizer", "ByteLevel without a split regex");
  read_special_tokens(file.parent_path(), spec);
  return spec;
}

}  // namespace dstrain::tokenizer
