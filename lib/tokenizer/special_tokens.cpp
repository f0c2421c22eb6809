#include "tokenizer/special_tokens.h"

#include <algorithm>
#include <optional>
#include <string>

#include "core/error.h"
#include "tokenizer/json_file.h"

namespace dstrain::tokenizer {
namespace {

namespace stdfs = std::filesystem;
using nlohmann::json;

// Which token string fills each role, and the file/key it came from.
struct Role {
  std::optional<std::string> content;
  std::string origin;
};
struct Roles {
  Role eos, bos, pad;
  std::vector<Role> additional;
};

// A token entry: "text", {"content": "text", ...} or null.
std::optional<std::string> token_content(const json& v, const std::string& origin) {
  if (v.is_null()) return std::nullopt;
  if (v.is_object() && v.contains("content"))
    return expect_string(v["content"], origin + ".content");
  if (!v.is_string()) {
    fail(ErrorKind::kInput,
         "{}: expected a token string, an object with \"content\", or null; "
         "got {}",
         origin, v.type_name());
  }
  return v.get<std::string>();
}

void read_roles(const json& cfg, const std::string& file, Roles& roles) {
  auto fill = [&](const char* key, Role& role) {
    if (role.content || !cfg.contains(key)) return;
    role = {token_content(cfg[key], file + ": " + key), file + ": " + key};
  };
  fill("eos_token", roles.eos);
  fill("bos_token", roles.bos);
  fill("pad_token", roles.pad);
  if (roles.additional.empty() && cfg.contains("additional_special_tokens")) {
    const std::string origin = file + ": additional_special_tokens";
    for (const json& v : expect_array(cfg["additional_special_tokens"], origin)) {
      roles.additional.push_back({token_content(v, origin), origin});
    }
  }
}

void read_added_tokens_decoder(const json& cfg, const std::string& file, BpeSpec& spec) {
  if (!cfg.contains("added_tokens_decoder")) return;
  const std::string origin = file + ": added_tokens_decoder";
  for (const auto& [key, v] : expect_object(cfg["added_tokens_decoder"], origin).items()) {
    const std::string where = origin + "." + key;
    expect_object(v, where);
    int32_t id = 0;
    try {
      id = static_cast<int32_t>(std::stoul(key));
    } catch (const std::exception&) {
      fail(ErrorKind::kInput, "{}: expected an integer token id as the key", where);
    }
    const bool special =
        v.contains("special") && v["special"].is_boolean() && v["special"].get<bool>();
    const json content = v.contains("content") ? v["content"] : json();
    spec.added.push_back({expect_string(content, where + ".content"), id, special});
  }
}

void read_added_tokens_json(const stdfs::path& path, BpeSpec& spec) {
  const std::string file = path.string();
  const json tokens = read_json_file(path);
  for (const auto& [content, v] : expect_object(tokens, file).items()) {
    spec.added.push_back({content, expect_id(v, file + ": " + content), false});
  }
}

// Id of a role's token, registering it as a special added token. Error(kInput) if it has no id.
std::optional<int32_t> resolve(const Role& role, BpeSpec& spec) {
  if (!role.content) return std::nullopt;
  for (AddedToken& t : spec.added) {
    if (t.content == *role.content) {
      t.special = true;
      return t.id;
    }
  }
  auto it = spec.vocab.find(*role.content);
  if (it == spec.vocab.end()) {
    fail(ErrorKind::kInput, "{}: token '{}' is neither an added token nor in the vocabulary ({})",
         role.origin, *role.content, spec.vocab_origin);
  }
  spec.added.push_back({*role.content, it->second, true});
  return it->second;
}

}  // namespace

void read_special_tokens(const stdfs::path& dir, BpeSpec& spec) {
  Roles roles;
  const stdfs::path config = dir / "tokenizer_config.json";
  const stdfs::path map = dir / "special_tokens_map.json";
  const bool has_config = stdfs::exists(config), has_map = stdfs::exists(map);
  if (has_config) {
    const json cfg = expect_object(read_json_file(config), config.string());
    read_added_tokens_decoder(cfg, config.string(), spec);
    read_roles(cfg, config.string(), roles);
  }
  if (stdfs::exists(dir / "added_tokens.json"))
    read_added_tokens_json(dir / "added_tokens.json", spec);
  if (has_map) read_roles(expect_object(read_json_file(map), map.string()), map.string(), roles);
  if (!has_config && !has_map) {
    const bool known = spec.vocab.count("<|endoftext|>") > 0 ||
                       std::any_of(spec.added.begin(), spec.added.end(), [](const AddedToken& t) {
                         return t.content == "<|endoftext|>";
                       });
    if (known) roles.eos = roles.bos = {"<|endoftext|>", "default GPT-2 eos/bos"};
  }
  spec.eos = resolve(roles.eos, spec);
  spec.bos = resolve(roles.bos, spec);
  spec.pad = resolve(roles.pad, spec);
  for (const Role& r : roles.additional) resolve(r, spec);
}

}  // namespace dstrain::tokenizer
