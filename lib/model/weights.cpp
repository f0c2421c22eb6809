#include "model/weights.h"

#include <map>
#include <set>

#include <fmt/ranges.h>

#include "core/error.h"
#include "core/fs.h"
#include "core/shared_files.h"
#include "core/text.h"
#include "model/safetensors.h"

namespace dstrain::model {
namespace stdfs = std::filesystem;
namespace {

// Names a checkpoint may hold that have no parameter here, and that are safe to skip.
bool tolerated_extra(const std::string& name, const ModelConfig& config) {
  if (name == "lm_head.weight" && config.tie_word_embeddings) return true;
  return ends_with(name, "rotary_emb.inv_freq");
}

// "a, b, c and 7 more"
std::string list_names(const std::vector<std::string>& names) {
  constexpr size_t kShown = 8;
  std::string s;
  for (size_t i = 0; i < names.size() && i < kShown; ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > kShown) s += fmt::format(" and {} more", names.size() - kShown);
  return s;
}

std::string shape_str(c10::IntArrayRef shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

}  // namespace

void check_weights(const SafetensorsSet& files, DecoderModelImpl& model, const stdfs::path& dir) {
  std::vector<std::string> missing, unexpected, mismatched;
  std::set<std::string> expected;
  for (const auto& item : model.named_parameters()) {
    expected.insert(item.key());
    if (!files.contains(item.key())) {
      missing.push_back(item.key());
      continue;
    }
    const TensorInfo& info = files.info(item.key());
    if (c10::IntArrayRef(info.shape) != item.value().sizes())
      mismatched.push_back(fmt::format("{} (file {}, model {})", item.key(), shape_str(info.shape),
                                       shape_str(item.value().sizes())));
  }
  for (const std::string& name : files.names())
    if (expected.count(name) == 0 && !tolerated_extra(name, model.config()))
      unexpected.push_back(name);
  std::string problems;
  if (!missing.empty()) problems += fmt::format("; missing tensors: {}", list_names(missing));
  if (!unexpected.empty())
    problems += fmt::format("; unexpected tensors: {}", list_names(unexpected));
  if (!mismatched.empty())
    problems += fmt::format("; shape mismatches: {}", list_names(mismatched));
  if (!problems.empty())
    fail(ErrorKind::kInput, "{}: weights do not match the {} model of config.json{}", dir.string(),
         model.config().model_type, problems);
}

void load_weights(DecoderModelImpl& model, const stdfs::path& dir) {
  const SafetensorsSet files(dir);
  check_weights(files, model, dir);
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters()) item.value().copy_(files.read(item.key()));
}

void save_weights(DecoderModelImpl& model, const stdfs::path& dir, torch::ScalarType dtype,
                  uint64_t max_shard_bytes) {
  const std::string name = dtype_name(dtype);
  fs::create_dirs(dir);
  NamedTensors tensors;
  for (const auto& item : model.named_parameters()) tensors.emplace_back(item.key(), item.value());
  write_safetensors_dir(dir, tensors, max_shard_bytes, dtype);
  fs::write_file_atomic(dir / shared_files::kModelConfig,
                        to_json(model.config(), name).dump(2) + "\n");
}

}  // namespace dstrain::model
