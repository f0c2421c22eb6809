#include "launcher/elastic_batch.h"

#include <algorithm>
#include <cstdint>
#include <numeric>

#include <fmt/format.h>

#include "config/config.h"
#include "core/error.h"
#include "launcher/output.h"

namespace dstrain::launcher {
namespace {

struct BatchShape {
  int64_t micro = 1, accum = 1, train_batch_size = -1;
  int64_t sequence_parallel = 1, tensor_parallel = 1, pipeline = 1;
};

BatchShape batch_shape(const LocalLaunchOptions& launch, int world) {
  config::LoadOptions load;
  load.overrides = launch.overrides;
  load.world_size = world;
  const config::Config c = config::load_config(launch.config_path, load);
  return {c.training.per_device_train_batch_size,
          c.training.gradient_accumulation_steps,
          c.training.train_batch_size,
          c.parallel.sequence_parallel_size,
          c.parallel.tensor_parallel_size,
          c.parallel.pipeline_parallel_size};
}

// The nearest whole accumulation for b's global batch on new_world ranks.
int64_t nearest_accumulation(const BatchShape& b, int world, int new_world) {
  const int64_t per_step = b.micro * new_world;
  return std::max<int64_t>(1, (b.micro * b.accum * world + per_step / 2) / per_step);
}

bool batch_kept(const BatchShape& b, int world, int new_world) {
  return (b.micro * b.accum * world) % (b.micro * new_world) == 0;
}

std::string unkept_batch(const BatchShape& b, int world, int new_world) {
  const int64_t nearest = nearest_accumulation(b, world, new_world);
  return fmt::format(
      "the global batch {} (micro {} x accumulation {} x {} ranks) cannot be kept on {} rank(s): "
      "it is not a multiple of micro {} x {} ranks; --elastic-batch allow-change accepts the "
      "nearest, {} (accumulation {})",
      b.micro * b.accum * world, b.micro, b.accum, world, new_world, b.micro, new_world,
      nearest * b.micro * new_world, nearest);
}

}  // namespace

std::vector<std::string> batch_overrides(const LocalLaunchOptions& launch, bool allow_change,
                                         int world, int new_world) {
  if (new_world == world || launch.exec) return {};
  const BatchShape b = batch_shape(launch, world);
  const int64_t per_step = b.micro * new_world;  // samples of one micro-step on the new world
  int64_t accum = b.micro * b.accum * world / per_step;
  if (!batch_kept(b, world, new_world)) {
    if (!allow_change) fail(ErrorKind::kConfig, "{}", unkept_batch(b, world, new_world));
    accum = nearest_accumulation(b, world, new_world);
    write_all(2, fmt::format("dstrain launch: global batch {} -> {} on {} rank(s) (accumulation "
                             "{}; --elastic-batch allow-change)\n",
                             b.micro * b.accum * world, accum * per_step, new_world, accum));
  }
  std::vector<std::string> out = {fmt::format("training.gradient_accumulation_steps={}", accum)};
  if (b.train_batch_size > 0)
    out.push_back(fmt::format("training.train_batch_size={}", accum * per_step));
  return out;
}

// Sums of the node sizes over the subsets of at least `min_nodes` nodes (dynamic programming over
// node count and rank count).
std::set<int> shrunk_worlds(const std::vector<int>& node_sizes, int min_nodes) {
  const size_t n = node_sizes.size();
  std::vector<std::set<int>> sums(n + 1);  // sums[c]: rank counts of c nodes
  sums[0].insert(0);
  for (int size : node_sizes) {
    for (size_t c = n; c >= 1; --c) {
      for (int s : sums[c - 1]) sums[c].insert(s + size);
    }
  }
  std::set<int> out;
  for (size_t c = static_cast<size_t>(std::max(1, min_nodes)); c < n; ++c)
    out.insert(sums[c].begin(), sums[c].end());
  return out;
}

void check_elastic_batch(const LocalLaunchOptions& launch, bool allow_change, int min_nodes,
                         const std::vector<int>& node_sizes, const char* what) {
  if (min_nodes <= 0 || launch.exec) return;
  if (min_nodes > static_cast<int>(node_sizes.size())) {
    fail(ErrorKind::kUsage, "--min-nodes {} is more than the {} {} selected", min_nodes,
         node_sizes.size(), what);
  }
  const int world = std::accumulate(node_sizes.begin(), node_sizes.end(), 0);
  const BatchShape b = batch_shape(launch, world);  // read once for every world it could shrink to
  for (int smaller : shrunk_worlds(node_sizes, min_nodes)) {
    // Pipeline stages, sequence- or tensor-parallel groups cannot be formed at all: no batch
    // choice helps.
    if (smaller % (b.pipeline * b.sequence_parallel * b.tensor_parallel) != 0) {
      fail(ErrorKind::kConfig,
           "--min-nodes {} lets the job shrink to {} rank(s), which "
           "parallel.pipeline_parallel_size {} x parallel.sequence_parallel_size {} x "
           "parallel.tensor_parallel_size {} does not divide; raise --min-nodes or use hosts "
           "whose rank counts keep it",
           min_nodes, smaller, b.pipeline, b.sequence_parallel, b.tensor_parallel);
    }
    if (!allow_change && !batch_kept(b, world, smaller)) {
      fail(ErrorKind::kConfig, "--min-nodes {} lets the job shrink to {} rank(s): {}", min_nodes,
           smaller, unkept_batch(b, world, smaller));
    }
  }
}

}  // namespace dstrain::launcher
