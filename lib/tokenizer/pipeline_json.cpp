#include "tokenizer/pipeline_json.h"

#include <fmt/format.h>

#include "core/error.h"
#include "core/utf8.h"
#include "tokenizer/json_file.h"
#include "tokenizer/split_regex.h"

namespace dstrain::tokenizer {
namespace {

using nlohmann::json;

std::string type_of(const json& j, const std::string& origin) {
  return expect_string(expect_object(j, origin).value("type", json()), origin + ".type");
}

// The literal of a {"String": s} pattern; a Regex pattern (or an empty string) is not supported.
std::string string_pattern(const json& j, const std::string& origin, const std::string& what) {
  const json pattern = j.value("pattern", json());
  expect_object(pattern, origin + ".pattern");
  if (!pattern.contains("String")) unsupported(origin + ".pattern", what + " with a Regex pattern");
  const std::string& s = expect_string(pattern["String"], origin + ".pattern.String");
  if (s.empty()) unsupported(origin + ".pattern", what + " with an empty pattern");
  return s;
}

// A string of exactly one character (Metaspace's replacement, Strip's content).
std::string one_character(const json& v, const std::string& origin) {
  const std::string& s = expect_string(v, origin);
  size_t pos = 0;
  if (s.empty() || find_invalid_utf8(s) || (next_code_point(s, pos), pos != s.size())) {
    fail(ErrorKind::kInput, "{}: expected one character, got \"{}\"", origin, s);
  }
  return s;
}

size_t count(const json& j, const char* key, const std::string& origin) {
  const json v = j.value(key, json(0));
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) {
    fail(ErrorKind::kInput, "{}.{}: expected a count (0, 1, ...), got {}", origin, key, v.dump());
  }
  return v.get<size_t>();
}

// Metaspace, as the pre-tokenizer and the decoder spell it; an older file's add_prefix_space
// (without prepend_scheme) means "always", and false must go with prepend_scheme "never", as the
// reference reads it.
MetaspaceSpec read_metaspace(const json& m, const std::string& origin) {
  MetaspaceSpec spec;
  spec.replacement = one_character(m.value("replacement", json()), origin + ".replacement");
  const std::string scheme = m.contains("prepend_scheme")
                                 ? expect_string(m["prepend_scheme"], origin + ".prepend_scheme")
                                 : "always";
  if (scheme == "always") {
    spec.prepend_scheme = PrependScheme::kAlways;
  } else if (scheme == "first") {
    spec.prepend_scheme = PrependScheme::kFirst;
  } else if (scheme == "never") {
    spec.prepend_scheme = PrependScheme::kNever;
  } else {
    fail(ErrorKind::kInput, "{}.prepend_scheme: expected always, first or never, got \"{}\"",
         origin, scheme);
  }
  if (m.contains("add_prefix_space") && !m.value("add_prefix_space", true) &&
      spec.prepend_scheme != PrependScheme::kNever) {
    fail(ErrorKind::kInput,
         "{}: add_prefix_space false contradicts prepend_scheme \"{}\" (expected \"never\")",
         origin, scheme);
  }
  spec.split = m.value("split", true);
  return spec;
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

void read_decoder_steps(const json& d, const std::string& origin, std::vector<DecoderStep>& steps) {
  const std::string type = type_of(d, origin);
  DecoderStep step;
  if (type == "Sequence") {
    const json list = d.value("decoders", json::array());
    for (size_t i = 0; i < expect_array(list, origin + ".decoders").size(); ++i) {
      read_decoder_steps(list[i], fmt::format("{}.decoders[{}]", origin, i), steps);
    }
    return;
  } else if (type == "Replace") {
    step.kind = DecoderStep::Kind::kReplace;
    step.pattern = string_pattern(d, origin, "a Replace decoder");
    step.content = expect_string(d.value("content", json()), origin + ".content");
  } else if (type == "ByteFallback") {
    step.kind = DecoderStep::Kind::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = DecoderStep::Kind::kFuse;
  } else if (type == "Strip") {
    step.kind = DecoderStep::Kind::kStrip;
    step.content = one_character(d.value("content", json()), origin + ".content");
    step.start = count(d, "start", origin);
    step.stop = count(d, "stop", origin);
  } else if (type == "Metaspace") {
    step.kind = DecoderStep::Kind::kMetaspace;
    step.metaspace = read_metaspace(d, origin);
  } else {
    unsupported(origin, "decoder '" + type + "'");
  }
  steps.push_back(std::move(step));
}

// TemplateProcessing's `single`: the ids of the special tokens before the sequence ($A).
std::vector<int32_t> template_prefix(const json& p, const std::string& origin) {
  std::vector<int32_t> ids;
  const json single = p.value("single", json());
  const json specials = p.value("special_tokens", json::object());
  for (size_t i = 0; i < expect_array(single, origin + ".single").size(); ++i) {
    const std::string where = fmt::format("{}.single[{}]", origin, i);
    const json& piece = expect_object(single[i], where);
    if (piece.contains("Sequence")) break;
    const std::string name =
        expect_string(piece.value("SpecialToken", json::object()).value("id", json()),
                      where + ".SpecialToken.id");
    const std::string token = fmt::format("{}.special_tokens[\"{}\"]", origin, name);
    if (!expect_object(specials, origin + ".special_tokens").contains(name)) {
      fail(ErrorKind::kInput, "{}: no such special token (named by {})", token, where);
    }
    const json list = specials[name].value("ids", json());
    for (size_t k = 0; k < expect_array(list, token + ".ids").size(); ++k) {
      ids.push_back(expect_id(list[k], fmt::format("{}.ids[{}]", token, k)));
    }
  }
  return ids;
}

}  // namespace

void unsupported(const std::string& origin, const std::string& what) {
  fail(ErrorKind::kInput,
       "{}: {} is not supported (expected a byte-level or a SentencePiece-style BPE tokenizer; "
       "see docs/tokenizers.md)",
       origin, what);
}

void read_normalizer(const json& n, const std::string& origin, BpeSpec& spec) {
  if (n.is_null()) return;
  const std::string type = type_of(n, origin);
  NormalizerStep step;
  if (type == "Sequence") {
    const json list = n.value("normalizers", json::array());
    for (size_t i = 0; i < expect_array(list, origin + ".normalizers").size(); ++i) {
      read_normalizer(list[i], fmt::format("{}.normalizers[{}]", origin, i), spec);
    }
    return;
  } else if (type == "NFC") {
    step.kind = NormalizerStep::Kind::kNfc;
  } else if (type == "Prepend") {
    step.kind = NormalizerStep::Kind::kPrepend;
    step.text = expect_string(n.value("prepend", json()), origin + ".prepend");
  } else if (type == "Replace") {
    step.kind = NormalizerStep::Kind::kReplace;
    step.pattern = string_pattern(n, origin, "a Replace normalizer");
    step.text = expect_string(n.value("content", json()), origin + ".content");
  } else {
    unsupported(origin, "normalizer '" + type + "'");
  }
  spec.normalizer.push_back(std::move(step));
}

void read_pre_tokenizer(const json& p, const std::string& origin, BpeSpec& spec, bool& byte_level) {
  const std::string type = type_of(p, origin);
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
  } else if (type == "Metaspace") {
    if (spec.metaspace) unsupported(origin, "more than one Metaspace pre-tokenizer");
    spec.metaspace = read_metaspace(p, origin);
  } else {
    unsupported(origin, "pre-tokenizer '" + type + "'");
  }
}

Decoder read_decoder(const json& d, const std::string& origin) {
  if (d.is_null()) return Decoder();
  std::vector<DecoderStep> steps;
  read_decoder_steps(d, origin, steps);
  return Decoder(std::move(steps));
}

std::vector<int32_t> read_post_processor_prefix(const json& p, const std::string& origin) {
  if (p.is_null()) return {};
  const std::string type = type_of(p, origin);
  if (type == "ByteLevel") return {};
  if (type == "TemplateProcessing") return template_prefix(p, origin);
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    const json cls = p.value("cls", json());
    if (!cls.is_array() || cls.size() != 2) {
      fail(ErrorKind::kInput, "{}.cls: expected [token, id], got {}", origin, cls.dump());
    }
    return {expect_id(cls[1], origin + ".cls[1]")};
  }
  if (type == "Sequence") {
    std::vector<int32_t> ids;
    const json list = p.value("processors", json::array());
    for (size_t i = 0; i < expect_array(list, origin + ".processors").size(); ++i) {
      std::vector<int32_t> outer =
          read_post_processor_prefix(list[i], fmt::format("{}.processors[{}]", origin, i));
      ids.insert(ids.begin(), outer.begin(), outer.end());
    }
    return ids;
  }
  unsupported(origin, "post-processor '" + type + "'");
}

}  // namespace dstrain::tokenizer
