#include "ckpt/manifest.h"

#include <filesystem>

#include "ckpt/layout.h"
#include "core/error.h"
#include "core/fs.h"

namespace dstrain::ckpt {
namespace stdfs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kFormat = "dstrain-checkpoint";

// Version 1 kept each component's state as top-level keys.
std::map<std::string, ComponentRecord> components_v1(const json& j) {
  std::map<std::string, ComponentRecord> out;
  out["engine"] = {1, {{"optimizer_steps", j.at("optimizer_steps")}}};
  out["loss_scaler"] = {1, j.at("loss_scaler")};
  out["loader"] = {1, j.at("loader")};
  out["progress"] = {1,
                     {{"step", j.at("step")},
                      {"tokens_seen", j.at("tokens_seen")},
                      {"train_loss", j.value("train_loss", 0.0)}}};
  if (j.contains("lora")) out["lora"] = {1, j.at("lora")};
  return out;
}

std::map<std::string, ComponentRecord> components_v2(const json& j) {
  std::map<std::string, ComponentRecord> out;
  for (const auto& [name, rec] : j.at("state").items()) {
    out[name] = {rec.at("version").get<int>(), rec.at("state")};
  }
  return out;
}

}  // namespace

const ComponentRecord* Manifest::component(const std::string& name) const {
  const auto it = components.find(name);
  return it == components.end() ? nullptr : &it->second;
}

json manifest_to_json(const Manifest& m) {
  json files = json::array();
  for (const FileRecord& f : m.files) {
    files.push_back({{"name", f.name}, {"bytes", f.bytes}, {"crc32", f.crc32}});
  }
  json state = json::object();
  for (const auto& [name, rec] : m.components) {
    state[name] = {{"version", rec.version}, {"state", rec.state}};
  }
  return {{"format", kFormat},
          {"version", kManifestVersion},
          {"tag", m.tag},
          {"step", m.step},
          {"world_size", m.world_size},
          {"zero_stage", m.zero_stage},
          {"compute_dtype", m.compute_dtype},
          {"model", {{"name_or_path", m.model_name_or_path}, {"dir", m.model_dir}}},
          {"tokenizer", m.tokenizer},
          {"config", m.config_yaml},
          {"train_loss", m.train_loss},
          {"created_unix", m.created_unix},
          {"files", files},
          {"state", state}};
}

Manifest manifest_from_json(const json& j, const std::string& origin) {
  if (!j.is_object() || j.value("format", "") != kFormat) {
    fail(ErrorKind::kInput, "{}: not a dstrain checkpoint manifest (\"format\": \"{}\" expected)",
         origin, kFormat);
  }
  const int version = j.value("version", 0);
  if (version < 1 || version > kManifestVersion) {
    fail(ErrorKind::kInput, "{}: manifest version {} is not one this dstrain reads (1 to {})",
         origin, version, kManifestVersion);
  }
  Manifest m;
  try {
    m.tag = j.value("tag", "");
    m.step = j.at("step").get<int64_t>();
    m.world_size = j.at("world_size").get<int>();
    m.zero_stage = j.value("zero_stage", 0);
    m.compute_dtype = j.value("compute_dtype", "float32");
    if (j.contains("model")) {
      m.model_name_or_path = j["model"].value("name_or_path", "");
      m.model_dir = j["model"].value("dir", "");
    }
    m.tokenizer = j.value("tokenizer", "");
    m.config_yaml = j.value("config", "");
    m.train_loss = j.value("train_loss", 0.0);
    m.created_unix = j.value("created_unix", 0.0);
    for (const json& f : j.at("files")) {
      m.files.push_back({f.at("name").get<std::string>(), f.at("bytes").get<int64_t>(),
                         f.at("crc32").get<std::string>()});
    }
    m.components = version == 1 ? components_v1(j) : components_v2(j);
  } catch (const json::exception& e) {
    fail(ErrorKind::kInput, "{}: malformed checkpoint manifest: {}", origin, e.what());
  }
  if (m.world_size < 1) fail(ErrorKind::kInput, "{}: world_size must be at least 1", origin);
  return m;
}

Manifest read_manifest(const std::string& tag_dir) {
  const std::string path = (stdfs::path(tag_dir) / kManifestFile).string();
  json j;
  try {
    j = json::parse(fs::read_file(path));
  } catch (const json::exception& e) {
    fail(ErrorKind::kInput, "{}: not valid JSON: {}", path, e.what());
  }
  return manifest_from_json(j, path);
}

}  // namespace dstrain::ckpt
