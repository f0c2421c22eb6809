#include "tokenizer/tokenizer_json_reader.h"

#include <fmt/format.h>

#include "core/error.h"
#include "tokenizer/json_file.h"
#include "tokenizer/pipeline_json.h"
#include "tokenizer/special_tokens.h"

namespace dstrain::tokenizer {
namespace {

using nlohmann::json;

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

// unk_token, fuse_unk, byte_fallback (used by SentencePiece-style models) and dropout.
void read_unknown_handling(const json& model, const std::string& origin, BpeSpec& spec) {
  const json unk = model.value("unk_token", json());
  if (!unk.is_null()) spec.unk_token = expect_string(unk, origin + ".unk_token");
  spec.fuse_unk = model.value("fuse_unk", false);
  spec.byte_fallback = model.value("byte_fallback", false);
  const json dropout = model.value("dropout", json());
  if (!dropout.is_null() && !(dropout.is_number() && dropout.get<double>() == 0.0)) {
    unsupported(origin + ".dropout", "BPE dropout (a random tokenization)");
  }
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
  read_unknown_handling(model, origin, spec);
}

void read_added(const json& added, const std::string& file, BpeSpec& spec) {
  if (added.is_null()) return;
  for (size_t i = 0; i < expect_array(added, file + ": added_tokens").size(); ++i) {
    const std::string where = fmt::format("{}: added_tokens[{}]", file, i);
    const json& t = expect_object(added[i], where);
    const bool special = t.value("special", false);
    spec.added.push_back({expect_string(t.value("content", json()), where + ".content"),
                          expect_id(t.value("id", json()), where + ".id"), special,
                          t.value("normalized", !special)});
  }
}

// The pre-tokenizer decides the kind: with ByteLevel the vocabulary is byte-level symbols and a
// split regex is needed; without it the tokenizer is SentencePiece-style and its decoder is read.
void read_pipeline(const json& doc, const std::string& name, BpeSpec& spec) {
  read_normalizer(doc.value("normalizer", json()), name + ": normalizer", spec);
  bool byte_level = false;
  const std::string pre_origin = name + ": pre_tokenizer";
  const json pre = doc.value("pre_tokenizer", json());
  if (!pre.is_null()) read_pre_tokenizer(pre, pre_origin, spec, byte_level);
  spec.byte_level = byte_level;
  if (byte_level) {
    if (spec.metaspace) unsupported(pre_origin, "Metaspace together with ByteLevel");
    if (spec.split_pattern.empty()) unsupported(pre_origin, "ByteLevel without a split regex");
  } else {
    if (!spec.split_pattern.empty()) unsupported(pre_origin, "a Split without ByteLevel");
    spec.decoder = read_decoder(doc.value("decoder", json()), name + ": decoder");
  }
  spec.post_processor_prefix =
      read_post_processor_prefix(doc.value("post_processor", json()), name + ": post_processor");
}

}  // namespace

BpeSpec read_tokenizer_json(const std::filesystem::path& file) {
  const std::string name = file.string();
  const json doc = expect_object(read_json_file(file), name);
  BpeSpec spec;
  read_model(doc.value("model", json()), name, spec);
  read_added(doc.value("added_tokens", json()), name, spec);
  read_pipeline(doc, name, spec);
  read_special_tokens(file.parent_path(), spec);
  return spec;
}

}  // namespace dstrain::tokenizer
