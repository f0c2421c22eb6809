#include "model/expert_names.h"

#include <algorithm>
#include <regex>

#include <fmt/format.h>

#include "core/error.h"
#include "model/safetensors.h"

namespace dstrain::model {

std::vector<HubPiece> hub_pieces(const ModelConfig& config, const std::string& name,
                                 const std::vector<int64_t>& shape) {
  if (config.moe.experts == 0) return {};
  static const std::regex stack(
      R"(^(model\.layers\.\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$)");
  static const std::regex router(R"(^(model\.layers\.\d+)\.mlp\.gate\.weight$)");
  const bool mixtral = config.model_type == "mixtral";
  std::smatch m;
  if (mixtral && std::regex_match(name, m, router)) {
    return {{m[1].str() + ".block_sparse_moe.gate.weight", shape, 0}};
  }
  if (!std::regex_match(name, m, stack) || shape.size() != 3) return {};
  const std::string experts =
      m[1].str() + (mixtral ? ".block_sparse_moe.experts." : ".mlp.experts.");
  const auto hub = [&](int64_t e, const char* qwen, const char* mistral) {
    return fmt::format("{}{}.{}.weight", experts, e, mixtral ? mistral : qwen);
  };
  std::vector<HubPiece> out;
  const int64_t E = shape[0], rows = shape[1], cols = shape[2];
  for (int64_t e = 0; e < E; ++e) {
    const int64_t at = e * rows * cols;
    if (m[2] == "down_proj") {
      out.push_back({hub(e, "down_proj", "w2"), {rows, cols}, at});
    } else {
      const int64_t I = rows / 2;
      out.push_back({hub(e, "gate_proj", "w1"), {I, cols}, at});
      out.push_back({hub(e, "up_proj", "w3"), {I, cols}, at + I * cols});
    }
  }
  return out;
}

torch::Tensor read_parameter(const SafetensorsSet& files, const ModelConfig& config,
                             const std::string& name, const std::vector<int64_t>& shape,
                             int64_t begin, int64_t end) {
  if (files.contains(name)) return files.read_range(name, begin, end);
  const std::vector<HubPiece> pieces = hub_pieces(config, name, shape);
  if (pieces.empty()) fail(ErrorKind::kInternal, "weights: no tensor holds '{}'", name);
  std::vector<torch::Tensor> parts;
  for (const HubPiece& p : pieces) {
    int64_t numel = 1;
    for (int64_t d : p.shape) numel *= d;
    const int64_t lo = std::max(begin, p.offset), hi = std::min(end, p.offset + numel);
    if (lo < hi) parts.push_back(files.read_range(p.name, lo - p.offset, hi - p.offset));
  }
  if (parts.empty()) return torch::empty({0});
  return parts.size() == 1 ? parts.front() : torch::cat(parts);
}

}  // namespace dstrain::model
