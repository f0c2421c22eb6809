// Stage3Engine: construction of the units and shards.
#include "zero/stage3_engine.h"

#include <algorithm>
#include <map>
#include <set>

#include "core/error.h"
#include "model/storage.h"

namespace dstrain::zero {
namespace {

// One bucket per unit: the whole unit is one all-gather and one reduce-scatter.
constexpr int64_t kWholeUnit = int64_t{1} << 62;

torch::Device host_for(bool offload, const torch::Device& device) {
  return offload ? torch::Device(torch::kCPU) : device;
}

// Host memory for offloaded state: pinned when CUDA is there, so copies can be asynchronous.
torch::TensorOptions state_options(const torch::Device& where, torch::ScalarType dtype,
                                   const torch::Device& compute_device) {
  auto options = torch::TensorOptions().dtype(dtype).device(where);
  if (where.is_cpu() && compute_device.is_cuda()) options = options.pinned_memory(true);
  return options;
}

}  // namespace

Stage3Engine::Stage3Engine(std::vector<NamedParameter> params, comm::Communicator& comm,
                           const OptimizerFactory& make_optimizer, EngineOptions options)
    : comm_(comm),
      options_(std::move(options)),
      device_(params.empty() ? torch::Device(torch::kCPU) : params.front().tensor.device()),
      host_device_(host_for(options_.offload_optimizer, device_)) {
  validate(params);
  torch::NoGradGuard no_grad;
  build_units(params);
  torch::Tensor master = build_shards();
  options_.initial_values = nullptr;  // whatever it holds (open files) is not needed any more
  const bool alias = master.is_same(param_shard_);
  master_ = std::make_unique<MasterState>(std::move(master), alias, master_layout(), make_optimizer,
                                          options_, comm_, device_);
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].frozen) continue;
    hooks_.push_back(add_post_accumulate_hook(params_[i].tensor, [this, i] { on_grad_ready(i); }));
  }
}

Stage3Engine::~Stage3Engine() {
  for (Reduction& r : in_flight_) r.work->wait();
  for (Unit& unit : units_) {
    if (unit.gather) unit.gather->wait();
  }
}

void Stage3Engine::validate(const std::vector<NamedParameter>& params) const {
  std::set<std::string> names;
  for (const NamedParameter& p : params) {
    if (!p.tensor.defined() || p.tensor.requires_grad() == p.frozen || !p.tensor.is_leaf()) {
      fail(ErrorKind::kInternal,
           "zero engine: parameter '{}' is not a leaf that {} grad (frozen: {})", p.name,
           p.frozen ? "does not require" : "requires", p.frozen);
    }
    if (!names.insert(p.name).second) {
      fail(ErrorKind::kInternal, "zero engine: parameter name '{}' appears twice", p.name);
    }
    if (p.tensor.device() != device_) {
      fail(ErrorKind::kInternal, "zero engine: parameters on different devices ('{}')", p.name);
    }
    if (p.unit < 0) fail(ErrorKind::kInternal, "zero engine: '{}' has unit {}", p.name, p.unit);
  }
  if (options_.prefetch_bucket_size < 0 || options_.param_persistence_threshold < 0) {
    fail(
        ErrorKind::kConfig,
        "stage3_prefetch_bucket_size ({}) and stage3_param_persistence_threshold ({}) must be >= 0",
        options_.prefetch_bucket_size, options_.param_persistence_threshold);
  }
}

// Where parameter `p` goes: its block's trainable or frozen unit, or a persistent one when small.
Stage3Engine::Unit::Key Stage3Engine::unit_key(const NamedParameter& p) const {
  using Role = Unit::Role;
  if (p.tensor.numel() < options_.param_persistence_threshold)
    return {p.frozen ? Role::kPersistentFrozen : Role::kPersistent, -1};
  return {p.frozen ? Role::kFrozenBlock : Role::kBlock, p.unit};
}

// Internal units (see num_units()): every block's trainable unit, every block's frozen unit, the
// persistent trainable unit, the persistent frozen unit. Segments are rewritten to read both units
// of each of their blocks.
void Stage3Engine::build_units(const std::vector<NamedParameter>& params) {
  using Role = Unit::Role;
  int blocks = 0;
  for (const NamedParameter& p : params) blocks = std::max(blocks, p.unit + 1);
  // Blocks without parameters here (another engine's, GroupedEngine) are empty units.
  for (const auto& segment : options_.segments) {
    for (int b : segment) blocks = std::max(blocks, b + 1);
  }
  std::vector<Unit::Key> keys;
  for (const Role role : {Role::kBlock, Role::kFrozenBlock}) {
    for (int b = 0; b < blocks; ++b) keys.emplace_back(role, b);
  }
  keys.emplace_back(Role::kPersistent, -1);
  keys.emplace_back(Role::kPersistentFrozen, -1);
  std::map<Unit::Key, size_t> index;
  for (size_t u = 0; u < keys.size(); ++u) index[keys[u]] = u;
  std::vector<std::vector<size_t>> members(keys.size());
  for (size_t i = 0; i < params.size(); ++i) members[index.at(unit_key(params[i]))].push_back(i);
  params_ = params;
  unit_of_.resize(params.size());
  persistent_unit_ = index.at({Role::kPersistent, -1});
  persistent_frozen_unit_ = index.at({Role::kPersistentFrozen, -1});
  const int world = comm_.world_size();
  for (size_t u = 0; u < keys.size(); ++u) {
    std::vector<int64_t> numels;
    for (size_t i : members[u]) {
      numels.push_back(params[i].tensor.numel());
      unit_of_[i] = u;
    }
    Unit unit(keys[u], members[u], Partition(numels, world, kWholeUnit));
    int64_t& total = unit.frozen() ? frozen_numel_ : shard_numel_;
    unit.shard_offset = total;
    total += unit.partition.shard_numel();
    units_.push_back(std::move(unit));
  }
  if (options_.segments.empty()) {
    for (int b = 0; b < blocks; ++b) options_.segments.push_back({b});
  }
  for (auto& segment : options_.segments) {
    std::vector<int> internal;
    for (const Role role : {Role::kBlock, Role::kFrozenBlock}) {
      for (int b : segment) {
        if (b < 0 || b >= blocks) {
          fail(ErrorKind::kInternal, "zero engine: a segment reads unit {} of {}", b, blocks);
        }
        internal.push_back(static_cast<int>(index.at({role, b})));
      }
    }
    segment = internal;
  }
}

// The shards are cut from the initial values: from options_.initial_values when set (the
// parameters may then hold no memory), else from the parameters (every rank holding the full
// model). Only the persistent unit stays gathered; other units' buffers never get memory here.
// Returns the fp32 master shard: param_shard_ itself in fp32 compute when both live in the same
// memory.
torch::Tensor Stage3Engine::build_shards() {
  const auto compute = torch::TensorOptions().dtype(options_.compute_dtype).device(device_);
  const torch::Device param_home = host_for(options_.offload_param, device_);
  param_shard_ =
      torch::zeros({shard_numel_}, state_options(param_home, options_.compute_dtype, device_));
  frozen_shard_ =
      torch::zeros({frozen_numel_}, state_options(param_home, options_.compute_dtype, device_));
  // Offloading the optimizer, the gradient shard is the fp32 one the host update reads: each
  // unit's reduced chunk is added there as soon as its reduce-scatter completes (streamed during
  // backward), so the device keeps no gradient shard at all.
  grad_shard_ =
      options_.offload_optimizer
          ? torch::zeros({shard_numel_}, state_options(host_device_, torch::kFloat32, device_))
          : torch::zeros({shard_numel_}, compute);
  const bool alias = options_.compute_dtype == torch::kFloat32 &&
                     options_.offload_param == options_.offload_optimizer;
  torch::Tensor master =
      alias ? param_shard_
            : torch::zeros({shard_numel_}, state_options(host_device_, torch::kFloat32, device_));
  const int rank = comm_.rank();
  for (Unit& unit : units_) {
    // The master from the original values: compute-dtype rounding never reaches it. Frozen
    // chunks go straight to their compute-dtype shard.
    torch::Tensor& home = unit.frozen() ? frozen_shard_ : master;
    for (const ParamPiece& piece : unit.partition.owned_pieces(rank)) {
      const int64_t n = piece.elements.end - piece.elements.begin;
      home.narrow(0, unit.shard_offset + piece.offset, n)
          .copy_(initial_values(unit.params[piece.param], piece.elements));
    }
    // Never written unless persistent: untouched memory, released below once the views exist.
    unit.full = torch::empty({unit.partition.padded_numel()}, compute);
    if (unit.persistent()) unit.full.zero_();
    for (size_t k = 0; k < unit.params.size(); ++k) {
      torch::Tensor& p = params_[unit.params[k]].tensor;
      const int64_t offset = unit.partition.param_offset(k);
      const int64_t n = unit.partition.param_numel(k);
      if (unit.persistent())
        unit.full.narrow(0, offset, n).copy_(initial_values(unit.params[k], {0, n}));
      p.mutable_grad() = torch::Tensor();
      p.set_data(unit.full.narrow(0, offset, n).view(p.sizes()));
    }
    if (unit.persistent()) {
      unit.state = UnitState::kGathered;
    } else {
      model::release_storage(unit.full);
      unit.state = UnitState::kFree;
    }
  }
  if (!alias) param_shard_.copy_(master);
  return master;
}

torch::Tensor Stage3Engine::initial_values(size_t param, Range r) const {
  return initial_elements(params_[param], options_.initial_values, r);
}

// The master holds this rank's chunks of the trainable units, which are also what it saves.
MasterLayout Stage3Engine::master_layout() const {
  std::vector<MasterPiece> pieces;
  for (const Unit& unit : units_) {
    if (unit.frozen()) continue;
    for (const ParamPiece& piece : unit.partition.owned_pieces(comm_.rank())) {
      const NamedParameter& p = params_[unit.params[piece.param]];
      pieces.push_back({p.name, p.tensor.sizes().vec(), piece.elements,
                        unit.shard_offset + piece.offset, p.placement});
    }
  }
  return {pieces, pieces};
}

torch::Tensor Stage3Engine::shard_of(const Unit& unit, const torch::Tensor& shards) const {
  return shards.narrow(0, unit.shard_offset, unit.partition.shard_numel());
}

}  // namespace dstrain::zero
