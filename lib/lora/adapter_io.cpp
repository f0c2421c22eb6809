#include "lora/adapter_io.h"

#include <cmath>
#include <map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "lora/targets.h"
#include "model/safetensors.h"

namespace dstrain::lora {
namespace stdfs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kPrefix = "base_model.model.";

json number(double v) {
  if (std::floor(v) == v && std::abs(v) < 1e15) return static_cast<int64_t>(v);
  return v;
}

json config_json(const Adapter& a) {
  const LoraOptions& o = a.options;
  json targets = o.target_regex ? json(o.target_modules.at(0)) : json(o.target_modules);
  json j = {
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"r", o.r},
      {"lora_alpha", number(o.alpha)},
      {"lora_dropout", o.dropout},
      {"target_modules", targets},
      {"bias", "none"},
      {"base_model_name_or_path", a.base_model},
      {"use_rslora", o.use_rslora},
      {"use_dora", false},
      {"init_lora_weights", o.init == "gaussian" ? json("gaussian") : json(true)},
      {"fan_in_fan_out", false},
      {"inference_mode", true},
      {"modules_to_save", o.modules_to_save.empty() ? json(nullptr) : json(o.modules_to_save)},
      {"layers_to_transform", nullptr},
      {"layers_pattern", nullptr},
      {"rank_pattern", json::object()},
      {"alpha_pattern", json::object()},
      {"revision", nullptr}};
  // Only where set, so that an adapter without expert stacks is written as before.
  if (!o.target_parameters.empty()) j["target_parameters"] = o.target_parameters;
  return j;
}

// Error(kInput) unless `j[key]` is absent, null, false, or empty.
void require_unset(const json& j, const char* key, const stdfs::path& file) {
  if (!j.contains(key)) return;
  const json& v = j.at(key);
  if (v.is_null() || (v.is_boolean() && !v.get<bool>()) ||
      ((v.is_object() || v.is_array()) && v.empty()))
    return;
  fail(ErrorKind::kInput, "{}: \"{}\" is {}; this build supports plain LoRA adapters without it",
       file.string(), key, v.dump());
}

// init_lora_weights: true/false/"gaussian"/"eva"/"orthogonal" only choose A and B's starting
// values, which the file holds. PiSSA, OLoRA, CorDA, LoftQ and LoRA-GA also rewrite the base
// weights (the adapter applies to that rewritten base), and MiCA is a LoRA variant: Error(kInput).
void require_plain_init(const json& j, const stdfs::path& file) {
  if (!j.contains("init_lora_weights")) return;
  const json& v = j.at("init_lora_weights");
  if (v.is_boolean() || v.is_null()) return;
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "gaussian" || s == "eva" || s == "orthogonal") return;
  }
  fail(ErrorKind::kInput,
       "{}: \"init_lora_weights\" is {}; an adapter of that initialisation applies to a modified "
       "base model (or is a LoRA variant), which this build does not support (convert it with "
       "PEFT's path_initial_model_for_weight_conversion first)",
       file.string(), v.dump());
}

LoraOptions parse_options(const json& j, const stdfs::path& file) {
  if (j.value("peft_type", "LORA") != "LORA") {
    fail(ErrorKind::kInput, "{}: peft_type is {}; expected \"LORA\"", file.string(),
         j.at("peft_type").dump());
  }
  if (j.contains("bias") && j.at("bias") != "none") {
    fail(ErrorKind::kInput, "{}: bias is {}; only \"none\" is supported", file.string(),
         j.at("bias").dump());
  }
  // Each of these changes which modules are adapted or what the adapter computes; PEFT writes
  // them unset (null, false, {} or []) for a plain LoRA adapter.
  for (const char* key :
       {"use_dora", "rank_pattern", "alpha_pattern", "exclude_modules", "layers_to_transform",
        "layer_replication", "lora_bias", "trainable_token_indices", "alora_invocation_tokens",
        "use_qalora", "use_bdlora", "arrow_config", "kasa_config", "monteclora_config"}) {
    require_unset(j, key, file);
  }
  require_plain_init(j, file);
  LoraOptions o;
  o.r = j.at("r").get<int64_t>();
  o.alpha = j.at("lora_alpha").get<double>();
  o.dropout = j.value("lora_dropout", 0.0);
  o.use_rslora = j.value("use_rslora", false);
  const json& t = j.at("target_modules");
  if (t.is_null()) {  // PEFT leaves it unset where target_parameters chooses the adapters
    o.target_modules = {};
  } else if (t.is_string()) {
    o.target_modules = {t.get<std::string>()};
    o.target_regex = !is_all_linear(o.target_modules);
  } else {
    o.target_modules = t.get<std::vector<std::string>>();
  }
  const auto saved = j.find("modules_to_save");
  if (saved != j.end() && !saved->is_null()) {
    o.modules_to_save = saved->get<std::vector<std::string>>();
  }
  const auto parameters = j.find("target_parameters");
  if (parameters != j.end() && !parameters->is_null()) {
    o.target_parameters = parameters->get<std::vector<std::string>>();
  }
  if (o.target_modules.empty() && o.target_parameters.empty()) {
    fail(ErrorKind::kInput, "{}: target_modules and target_parameters select nothing",
         file.string());
  }
  if (j.contains("init_lora_weights") && j.at("init_lora_weights") == "gaussian")
    o.init = "gaussian";
  if (o.r <= 0 || o.alpha <= 0) {
    fail(ErrorKind::kInput, "{}: r ({}) and lora_alpha ({}) must be positive", file.string(), o.r,
         o.alpha);
  }
  return o;
}

// "base_model.model.<module>.lora_A[.default].weight" → (<module>, 'A'); Error(kInput) otherwise.
std::pair<std::string, char> split_tensor_name(const std::string& name, const stdfs::path& file) {
  const std::string prefix = kPrefix;
  if (name.compare(0, prefix.size(), prefix) == 0) {
    std::string rest = name.substr(prefix.size());
    for (const char* which : {"A", "B"}) {
      for (const char* infix : {"", ".default"}) {
        const std::string suffix = fmt::format(".lora_{}{}.weight", which, infix);
        if (rest.size() > suffix.size() &&
            rest.compare(rest.size() - suffix.size(), suffix.size(), suffix) == 0) {
          return {rest.substr(0, rest.size() - suffix.size()), which[0]};
        }
      }
    }
  }
  fail(ErrorKind::kInput,
       "{}: tensor {} is not a LoRA weight; expected base_model.model.<module>.lora_A.weight or "
       "lora_B.weight",
       file.string(), name);
}

// modules_to_save's "base_model.model.<module>.weight" → <module>, where a name of `saved` selects
// the module (PEFT's plain suffix match); "" otherwise.
std::string whole_module(const std::string& name, const std::vector<std::string>& saved) {
  const std::string prefix = kPrefix, suffix = ".weight";
  if (name.size() <= prefix.size() + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return "";
  }
  const std::string module =
      name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  for (const auto& s : saved) {
    if (module.size() >= s.size() && module.compare(module.size() - s.size(), s.size(), s) == 0) {
      return module;
    }
  }
  return "";
}

std::vector<LoraWeights> read_weights(const stdfs::path& file, const LoraOptions& o) {
  const int64_t r = o.r;
  model::SafetensorsFile st(file);
  std::map<std::string, LoraWeights> by_module;
  std::vector<LoraWeights> out;
  for (const auto& name : st.names()) {
    if (const std::string module = whole_module(name, o.modules_to_save); !module.empty()) {
      out.push_back({module, {}, {}, st.read(name)});
      continue;
    }
    const auto [module, which] = split_tensor_name(name, file);
    LoraWeights& w = by_module[module];
    w.module = module;
    (which == 'A' ? w.A : w.B) = st.read(name);
  }
  for (auto& [module, w] : by_module) {
    if (!w.A.defined() || !w.B.defined()) {
      fail(ErrorKind::kInput, "{}: module {} has lora_{} but not lora_{}", file.string(), module,
           w.A.defined() ? "A" : "B", w.A.defined() ? "B" : "A");
    }
    // An expert stack's: [r·E, in] and [out, r·E] (E experts).
    if (w.A.dim() != 2 || w.B.dim() != 2 || w.A.size(0) % r != 0 || w.A.size(0) == 0 ||
        w.B.size(1) != w.A.size(0)) {
      fail(ErrorKind::kInput,
           "{}: module {}: lora_A must be [r, in] and lora_B [out, r] (an expert stack's "
           "[r·E, in] and [out, r·E]) with r = {} from adapter_config.json",
           file.string(), module, r);
    }
    out.push_back(std::move(w));
  }
  if (out.empty()) fail(ErrorKind::kInput, "{}: holds no LoRA weights", file.string());
  return out;
}

}  // namespace

void write_adapter(const stdfs::path& dir, const Adapter& adapter, torch::ScalarType dtype) {
  fs::create_dirs(dir);
  model::NamedTensors tensors;
  for (const auto& w : adapter.weights) {
    if (w.is_whole()) {  // PEFT's name for a modules_to_save weight
      tensors.emplace_back(kPrefix + w.module + ".weight", w.whole.detach());
      continue;
    }
    tensors.emplace_back(kPrefix + lora_a_name(w.module), w.A.detach());
    tensors.emplace_back(kPrefix + lora_b_name(w.module), w.B.detach());
  }
  model::write_safetensors(dir / kAdapterWeightsFile, tensors, dtype);
  fs::write_file_atomic(dir / kAdapterConfigFile, config_json(adapter).dump(2) + "\n");
}

Adapter read_adapter(const stdfs::path& dir) {
  const stdfs::path config_file = dir / kAdapterConfigFile;
  const stdfs::path weights_file = dir / kAdapterWeightsFile;
  for (const auto& f : {config_file, weights_file}) {
    if (!stdfs::is_regular_file(f)) {
      fail(ErrorKind::kInput, "{} is not a PEFT LoRA adapter: {} is missing", dir.string(),
           f.filename().string());
    }
  }
  Adapter a;
  try {
    const json j = json::parse(fs::read_file(config_file));
    a.options = parse_options(j, config_file);
    const auto base = j.find("base_model_name_or_path");
    if (base != j.end() && base->is_string()) a.base_model = base->get<std::string>();
  } catch (const json::exception& e) {
    fail(ErrorKind::kInput, "{}: not a valid adapter config: {}", config_file.string(), e.what());
  }
  a.weights = read_weights(weights_file, a.options);
  return a;
}

}  // namespace dstrain::lora
