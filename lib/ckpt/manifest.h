#pragma once
// manifest.json, the file whose presence makes a checkpoint complete (layout.h): what the run was
// (step, world, stage, dtype, model, config), every file of the checkpoint with its size and crc32,
// and each component's small state by name (stateful.h). Parsed and checked here, once; everything
// else reads the typed Manifest.
//
// Format version 2 keeps the components under "state": {"<name>": {"version": v, "state": {...}}}.
// Version 1 (the components as top-level keys) is still read: its keys are mapped onto the
// components "engine", "loss_scaler", "loader", "progress" and "lora".

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dstrain::ckpt {

inline constexpr int kManifestVersion = 2;

struct FileRecord {
  std::string name;
  int64_t bytes = 0;
  std::string crc32;  // 8 lowercase hex digits
};

struct ComponentRecord {
  int version = 0;
  nlohmann::json state = nlohmann::json::object();
};

struct Manifest {
  std::string tag;
  int64_t step = 0;
  int world_size = 0;
  int zero_stage = 0;
  std::string compute_dtype = "float32";
  std::string model_name_or_path;
  std::string model_dir;
  std::string tokenizer;    // the run's model.tokenizer ("" = the model directory's)
  std::string config_yaml;  // the resolved run config
  double train_loss = 0;    // the loss of the step the checkpoint was taken at
  double created_unix = 0;
  std::vector<FileRecord> files;  // the shards in rank order, then every other file
  std::map<std::string, ComponentRecord> components;

  // The component's record, or nullptr when the checkpoint has none of that name.
  const ComponentRecord* component(const std::string& name) const;
};

nlohmann::json manifest_to_json(const Manifest& m);
// Error(kInput) naming `origin` (the manifest's path) for anything missing or of the wrong type.
Manifest manifest_from_json(const nlohmann::json& j, const std::string& origin);
// Reads and checks <tag_dir>/manifest.json.
Manifest read_manifest(const std::string& tag_dir);

}  // namespace dstrain::ckpt
