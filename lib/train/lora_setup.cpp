// LoRA wiring of the trainer: the base model is frozen and kept in the compute dtype only (no
// master copy, gradient or optimizer state: the engine sees only the adapters), checkpoints carry
// the adapters plus a checksum of the base, and the run ends with a PEFT adapter directory.

#include <filesystem>
#include <map>

#include <torch/torch.h>

#include "core/error.h"
#include "core/log.h"
#include "core/run_files.h"
#include "hub/resolve.h"
#include "lora/base_checksum.h"
#include "model/weights.h"
#include "train/component_options.h"
#include "train/lora_setup.h"
#include "train/trainer.h"

namespace dstrain::train {
namespace stdfs = std::filesystem;
using nlohmann::json;

lora::LoraOptions lora_options(const config::Config& c) {
  const auto& s = c.lora;  // lora.bias is none: the config refuses anything else
  lora::LoraOptions o;
  o.r = s.r;
  o.alpha = s.alpha;
  o.dropout = s.dropout;
  o.target_modules = s.target_modules;
  o.target_regex = lora::is_regex_target(s.target_modules);
  o.target_parameters = s.target_parameters;
  o.modules_to_save = s.modules_to_save;
  o.use_rslora = s.use_rslora;
  o.init = s.init;
  o.seed = c.training.seed;
  return o;
}

lora::LoraOptions options_from_adapter(const lora::LoraOptions& from_config,
                                       const lora::Adapter& adapter, const std::string& source) {
  lora::LoraOptions o = from_config;
  const lora::LoraOptions& a = adapter.options;
  auto differs = [&](const char* key, const std::string& config, const std::string& adapter_v) {
    if (config != adapter_v) {
      log::warn("lora.init_from {}: using the adapter's {} = {} instead of the config's {}", source,
                key, adapter_v, config);
    }
  };
  differs("r", std::to_string(o.r), std::to_string(a.r));
  differs("alpha", fmt::format("{}", o.alpha), fmt::format("{}", a.alpha));
  differs("target_modules", json(o.target_modules).dump(), json(a.target_modules).dump());
  differs("target_parameters", json(o.target_parameters).dump(), json(a.target_parameters).dump());
  differs("modules_to_save", json(o.modules_to_save).dump(), json(a.modules_to_save).dump());
  differs("use_rslora", o.use_rslora ? "true" : "false", a.use_rslora ? "true" : "false");
  o.r = a.r;
  o.alpha = a.alpha;
  o.target_modules = a.target_modules;
  o.target_regex = a.target_regex;
  o.target_parameters = a.target_parameters;
  o.modules_to_save = a.modules_to_save;
  o.use_rslora = a.use_rslora;
  return o;
}

json lora_options_json(const lora::LoraOptions& o) {
  return {{"r", o.r},
          {"alpha", o.alpha},
          {"dropout", o.dropout},
          {"target_modules", o.target_modules},
          {"target_regex", o.target_regex},
          {"target_parameters", o.target_parameters},
          {"modules_to_save", o.modules_to_save},
          {"use_rslora", o.use_rslora},
          {"init", o.init},
          {"seed", o.seed}};
}

lora::LoraOptions lora_options_from_json(const json& j) {
  lora::LoraOptions o;
  o.r = j.at("r").get<int64_t>();
  o.alpha = j.at("alpha").get<double>();
  o.dropout = j.at("dropout").get<double>();
  o.target_modules = j.at("target_modules").get<std::vector<std::string>>();
  o.target_regex = j.at("target_regex").get<bool>();
  // Absent in checkpoints written before adapters on expert stacks.
  o.target_parameters = j.value("target_parameters", std::vector<std::string>{});
  o.modules_to_save = j.value("modules_to_save", std::vector<std::string>{});
  o.use_rslora = j.at("use_rslora").get<bool>();
  o.init = j.at("init").get<std::string>();
  o.seed = j.at("seed").get<uint64_t>();
  return o;
}

model::DecoderModel rebuild_base_model(const model::ModelConfig& config, const json& lora,
                                       const std::string& checkpoint) {
  const json& base = lora.at("base");
  model::DecoderModel m =
      model::build_model(config, torch::kFloat, base.at("seed").get<uint64_t>());
  std::string from = fmt::format("random init with seed {}", base.at("seed").get<uint64_t>());
  if (base.at("init") == "pretrained") {
    std::string dir = base.at("dir").get<std::string>();
    if (!stdfs::is_directory(dir))
      dir = hub::resolve_model_dir({base.at("name_or_path").get<std::string>(),
                                    base.value("revision", std::string("main"))})
                .string();
    model::load_weights(*m, dir);
    from = dir;
  }
  const std::string want = base.at("checksum").get<std::string>();
  const std::string got = lora::base_checksum(*m);
  if (got != want) {
    fail(ErrorKind::kInput,
         "{}: the base model ({}) has checksum {} but the adapter was trained on a base with "
         "checksum {}; use the same base model",
         checkpoint, from, got, want);
  }
  return m;
}

LoraPlan lora_plan(const config::Config& c) {
  LoraPlan plan;
  plan.options = lora_options(c);
  plan.key = c.source_path;
  if (!c.lora.init_from.empty()) {
    lora::Adapter adapter = lora::read_adapter(c.lora.init_from);
    plan.options = options_from_adapter(plan.options, adapter, c.lora.init_from);
    plan.key = (stdfs::path(c.lora.init_from) / lora::kAdapterConfigFile).string();
    plan.load = std::move(adapter.weights);
    plan.load_source = c.lora.init_from;
  }
  return plan;
}

void Trainer::log_lora() const {
  const lora::LoraOptions& o = parallel_.lora->options();
  const double base_n = static_cast<double>(model_config_.num_parameters(true));
  const size_t whole = parallel_.lora->whole_modules().size();
  log::info("LoRA r={} alpha={} on {} modules{}: {} trainable parameters ({:.3f}% of the base){}",
            o.r, o.alpha, parallel_.lora->modules().size(),
            whole > 0 ? fmt::format(", {} trained whole", whole) : std::string(),
            parallel_.lora->num_parameters(),
            100.0 * static_cast<double>(parallel_.lora->num_parameters()) / base_n,
            cfg_.lora.init_from.empty() ? std::string() : ", from " + cfg_.lora.init_from);
}

std::string Trainer::base_checksum(const model::ValueSource& values,
                                   model::DecoderModelImpl& whole) {
  const auto params = whole.named_parameters();
  std::vector<double> parts(2 * params.size(), 0.0);  // crc, bytes: exact in a double
  for (size_t i = static_cast<size_t>(rank_); i < params.size(); i += static_cast<size_t>(world_)) {
    const torch::Tensor& p = params[i].value();
    const torch::Tensor value =
        values(params[i].key(), 0, p.numel()).to(torch::kFloat).view(p.sizes());
    const lora::TensorCrc crc = lora::tensor_crc(params[i].key(), value);
    parts[2 * i] = crc.crc;
    parts[2 * i + 1] = static_cast<double>(crc.bytes);
  }
  all_reduce(parts);
  std::vector<lora::TensorCrc> crcs;
  for (size_t i = 0; i < params.size(); ++i) {
    crcs.push_back({static_cast<uint32_t>(parts[2 * i]), static_cast<uint64_t>(parts[2 * i + 1])});
  }
  return lora::combine_checksum(crcs);
}

json Trainer::lora_reference_json() const {
  json j = lora_options_json(parallel_.lora->options());
  j["modules"] = parallel_.lora->modules();
  j["whole_modules"] = parallel_.lora->whole_modules();
  j["base"] = {{"name_or_path", cfg_.model.name_or_path},
               {"revision", cfg_.model.revision},
               {"dir", model_dir_},
               {"init", cfg_.model.init},
               {"seed", cfg_.training.seed},
               {"checksum", base_checksum_}};
  return j;
}

void Trainer::save_lora_adapter() {
  // Every rank owns some elements of the fp32 master (stages 1/2 shard it): each fills its pieces
  // into a zeroed full copy and one all-reduce adds them. Adapters are small.
  const auto params = parallel_.lora->block_parameters();
  std::map<std::string, int64_t> offset;
  int64_t total = 0;
  for (const auto& p : params) {
    offset[p.name] = total;
    total += p.tensor.numel();
  }
  torch::Tensor flat = torch::zeros({total}, torch::TensorOptions(torch::kFloat).device(device_));
  for (const auto& piece : parallel_.engine->owned_state()) {
    flat.narrow(0, offset.at(piece.param) + piece.elements.begin,
                piece.elements.end - piece.elements.begin)
        .copy_(piece.tensors.at("master"));
  }
  // Over the ranks that hold this rank's slices (every rank without tensor parallelism): the
  // slices whole on each of them; then the whole tensors from the slices.
  parallel_.tensor_parallel->replicas().all_reduce(flat, comm::ReduceOp::kSum)->wait();
  // Each pipeline stage holds its own blocks' adapters (zeros elsewhere).
  if (comm::Communicator* pipeline = parallel_.groups->pipeline()) {
    pipeline->all_reduce(flat, comm::ReduceOp::kSum)->wait();
  }
  std::map<std::string, torch::Tensor> whole;
  for (const auto& p : params) {
    const torch::Tensor mine = flat.narrow(0, offset.at(p.name), p.tensor.numel());
    whole[p.name] =
        parallel_.tensor_parallel->whole(mine.view(p.tensor.sizes()), p.placement).cpu();
  }
  if (rank_ == 0) {
    lora::Adapter adapter;
    adapter.options = parallel_.lora->options();
    adapter.base_model = cfg_.model.name_or_path;
    for (const auto& w : parallel_.lora->weights()) {
      if (w.is_whole()) {
        adapter.weights.push_back({w.module, {}, {}, whole.at(lora::whole_name(w.module))});
      } else {
        adapter.weights.push_back({w.module,
                                   whole.at(lora::lora_a_name(w.module)),
                                   whole.at(lora::lora_b_name(w.module)),
                                   {}});
      }
    }
    const stdfs::path dir = run_files::lora_adapter_dir(cfg_.logging.out_dir);
    lora::write_adapter(dir, adapter, torch::kFloat);
    log::info("LoRA adapter written to {}", dir.string());
  }
  comm_->barrier();
}

}  // namespace dstrain::train
