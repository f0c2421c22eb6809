#include "model/weights.h"

#include <map>
#include <set>

#include <fmt/ranges.h>

#include "core/error.h"
#include "core/fs.h"
#include "core/shared_files.h"
#include "core/text.h"
#include "model/expert_names.h"
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
  const auto check = [&](const std::string& name, c10::IntArrayRef shape) {
    expected.insert(name);
    if (!files.contains(name)) {
      missing.push_back(name);
      return;
    }
    const TensorInfo& info = files.info(name);
    if (c10::IntArrayRef(info.shape) != shape)
      mismatched.push_back(
          fmt::format("{} (file {}, model {})", name, shape_str(info.shape), shape_str(shape)));
  };
  for (const auto& item : model.named_parameters()) {
    const std::vector<HubPiece> pieces =
        hub_pieces(model.config(), item.key(), item.value().sizes().vec());
    if (files.contains(item.key()) || pieces.empty()) {
      check(item.key(), item.value().sizes());
    } else {
      for (const HubPiece& p : pieces) check(p.name, p.shape);
    }
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
  const ValueSource source = weights_source(dir, model);
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters()) {
    torch::Tensor& p = item.value();
    p.copy_(source(item.key(), 0, p.numel()).view(p.sizes()));
  }
}

ValueSource weights_source(const stdfs::path& dir, DecoderModelImpl& model) {
  auto files = std::make_shared<SafetensorsSet>(dir);
  check_weights(*files, model, dir);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& item : model.named_parameters()) shapes[item.key()] = item.value().sizes().vec();
  return [files, config = model.config(), shapes = std::move(shapes)](const std::string& name,
                                                                      int64_t begin, int64_t end) {
    return read_parameter(*files, config, name, shapes.at(name), begin, end);
  };
}

void save_weights(DecoderModelImpl& model, const stdfs::path& dir, torch::ScalarType dtype,
                  uint64_t max_shard_bytes) {
  const std::string name = dtype_name(dtype);
  fs::create_dirs(dir);
  NamedTensors tensors;
  for (const auto& item : model.named_parameters()) {
    const torch::Tensor& t = item.value();
    const std::vector<HubPiece> pieces = hub_pieces(model.config(), item.key(), t.sizes().vec());
    if (pieces.empty()) tensors.emplace_back(item.key(), t);
    for (const HubPiece& p : pieces) {
      int64_t numel = 1;
      for (int64_t d : p.shape) numel *= d;
      tensors.emplace_back(p.name,
                           t.detach().reshape({-1}).narrow(0, p.offset, numel).view(p.shape));
    }
  }
  write_safetensors_dir(dir, tensors, max_shard_bytes, dtype);
  fs::write_file_atomic(dir / shared_files::kModelConfig,
                        to_json(model.config(), name).dump(2) + "\n");
}

}  // namespace dstrain::model
