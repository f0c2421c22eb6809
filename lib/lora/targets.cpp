#include "lora/targets.h"

#include <algorithm>
#include <map>
#include <regex>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"

namespace dstrain::lora {
namespace {

TargetModule make_target(const model::ModelBlock& block, const model::Projection& p) {
  TargetModule t;
  t.path = block.name + "." + p.path;
  t.projection = p.key();
  t.block = block.index;
  t.in_features = p.linear->in_features;
  t.out_features = p.linear->out_features;
  t.linear = p.linear;
  t.weight = p.linear->weight;
  return t;
}

bool ends_with_dotted(const std::string& path, const std::string& name) {
  return path.size() > name.size() &&
         path.compare(path.size() - name.size(), name.size(), name) == 0 &&
         path[path.size() - name.size() - 1] == '.';
}

std::regex compile(const std::string& pattern, const std::string& key) {
  try {
    return std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    fail(ErrorKind::kConfig, "{}: '{}' is not a valid regular expression: {}", key, pattern,
         e.what());
  }
}

}  // namespace

std::vector<TargetModule> targetable_modules(model::DecoderModelImpl& model) {
  std::vector<TargetModule> out;
  for (const auto& block : model.blocks()) {
    for (const model::Projection& p : block->block->projections()) {
      out.push_back(make_target(*block, p));
    }
  }
  return out;
}

namespace {

// Each projection name once, in forward order.
std::vector<std::string> projection_names(model::DecoderModelImpl& model) {
  std::vector<std::string> names;
  std::set<std::string> seen;
  for (const auto& t : targetable_modules(model)) {
    if (seen.insert(t.projection).second) names.push_back(t.projection);
  }
  return names;
}

}  // namespace

std::string targetable_names(model::DecoderModelImpl& model) {
  return fmt::format("{}", fmt::join(projection_names(model), ", "));
}

bool is_regex_target(const std::vector<std::string>& targets) {
  return targets.size() == 1 && targets[0].find_first_of("*+?()[]{}|^$\\") != std::string::npos;
}

bool is_all_linear(const std::vector<std::string>& targets) {
  return targets.size() == 1 && targets[0] == kAllLinear;
}

std::vector<std::string> expand_all_linear(model::DecoderModelImpl& model,
                                           const std::vector<std::string>& targets) {
  return is_all_linear(targets) ? projection_names(model) : targets;
}

bool target_matches(const std::vector<std::string>& targets, bool regex, const std::string& path) {
  if (regex) return std::regex_match(path, std::regex(targets.at(0), std::regex::ECMAScript));
  for (const auto& name : targets) {
    if (path == name || ends_with_dotted(path, name)) return true;
  }
  return false;
}

std::vector<TargetModule> resolve_targets(model::DecoderModelImpl& model,
                                          const std::vector<std::string>& targets, bool regex,
                                          const std::string& key) {
  if (targets.empty())
    fail(ErrorKind::kConfig, "{}: the list is empty; name modules such as q_proj", key);
  if (!regex && is_all_linear(targets)) return targetable_modules(model);
  std::vector<TargetModule> all = targetable_modules(model);
  std::set<std::string> targetable;
  for (const auto& t : all) targetable.insert(t.path);
  const std::regex re = regex ? compile(targets[0], key) : std::regex();
  // Every module of the model, so that a name selecting a norm or lm_head is told apart from a
  // name selecting nothing.
  std::set<std::string> used;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    const std::string& path = item.key();
    for (const auto& name : targets) {
      const bool hit =
          regex ? std::regex_match(path, re) : (path == name || ends_with_dotted(path, name));
      if (!hit) continue;
      used.insert(name);
      if (!targetable.count(path)) {
        fail(ErrorKind::kConfig,
             "{}: '{}' selects module {}, which cannot carry a LoRA adapter; targetable modules "
             "are the projections {}",
             key, name, path, targetable_names(model));
      }
    }
  }
  for (const auto& name : targets) {
    if (!used.count(name)) {
      fail(ErrorKind::kConfig,
           "{}: '{}' matches no module of the model (module paths look like {}); targetable "
           "modules: {}",
           key, name, all.empty() ? std::string("none") : all.front().path,
           targetable_names(model));
    }
  }
  std::vector<TargetModule> out;
  for (auto& t : all) {
    if (regex ? std::regex_match(t.path, re) : target_matches(targets, false, t.path)) {
      out.push_back(std::move(t));
    }
  }
  return out;
}

std::vector<TargetModule> resolve_whole(model::DecoderModelImpl& model,
                                        const std::vector<std::string>& names,
                                        const std::string& key) {
  if (names.empty()) return {};
  std::vector<TargetModule> routers;
  for (const auto& block : model.blocks()) {
    for (const model::Projection& p : block->block->routers()) {
      TargetModule t = make_target(*block, p);
      t.whole = true;
      routers.push_back(std::move(t));
    }
  }
  const auto selects = [](const std::string& path, const std::string& name) {
    return path.size() >= name.size() &&
           path.compare(path.size() - name.size(), name.size(), name) == 0;
  };
  std::set<std::string> used;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    for (const auto& name : names) {
      if (!selects(item.key(), name)) continue;
      used.insert(name);
      const bool router = std::any_of(routers.begin(), routers.end(),
                                      [&](const TargetModule& t) { return t.path == item.key(); });
      if (!router) {
        fail(ErrorKind::kConfig,
             "{}: '{}' selects module {}; modules_to_save trains whole only a MoE layer's router "
             "(mlp.gate) and Qwen2-MoE's mlp.shared_expert_gate",
             key, name, item.key());
      }
    }
  }
  for (const auto& name : names) {
    if (used.count(name)) continue;
    fail(ErrorKind::kConfig, "{}: '{}' matches no module of the model{}", key, name,
         routers.empty() ? " (modules_to_save trains a MoE layer's router, and this model has none)"
                         : "; the routers are named like " + routers.front().path);
  }
  std::vector<TargetModule> out;
  for (auto& t : routers) {
    const bool chosen = std::any_of(names.begin(), names.end(),
                                    [&](const std::string& n) { return selects(t.path, n); });
    if (chosen) out.push_back(std::move(t));
  }
  return out;
}

std::vector<TargetModule> resolve_parameters(model::DecoderModelImpl& model,
                                             const std::vector<std::string>& targets,
                                             const std::string& key) {
  if (targets.empty()) return {};
  // Every stack, by its parameter name; grouped by experts module in forward order.
  std::map<std::string, TargetModule> stacks;
  std::vector<std::vector<std::string>> modules;
  for (const auto& block : model.blocks()) {
    std::string module;
    for (const model::ExpertStack& s : block->block->expert_stacks()) {
      TargetModule t;
      t.path = block->name + "." + s.path;
      t.projection = s.parameter;
      t.parameter = s.parameter;
      t.block = block->index;
      t.experts = s.experts;
      t.weight = s.experts->stack(s.parameter);
      t.num_experts = t.weight.size(0);
      t.out_features = t.weight.size(1);
      t.in_features = t.weight.size(2);
      if (t.path != module) modules.emplace_back();
      module = t.path;
      modules.back().push_back(t.path + "." + s.parameter);
      stacks.emplace(modules.back().back(), std::move(t));
    }
  }
  std::set<std::string> used;
  for (const auto& item : model.named_parameters()) {
    for (const auto& name : targets) {
      if (!target_matches({name}, false, item.key())) continue;
      used.insert(name);
      if (!stacks.count(item.key())) {
        fail(ErrorKind::kConfig,
             "{}: '{}' selects parameter {}, which is not an expert stack; target_parameters "
             "adapts the experts' gate_up_proj and down_proj (other weights: target_modules)",
             key, name, item.key());
      }
    }
  }
  for (const auto& name : targets) {
    if (used.count(name)) continue;
    fail(ErrorKind::kConfig, "{}: '{}' matches no parameter of the model; {}", key, name,
         stacks.empty() ? std::string("it has no expert stacks (a Mixture-of-Experts model's "
                                      "mlp.experts.gate_up_proj and mlp.experts.down_proj)")
                        : "expert stacks are named like " + modules.front().front());
  }
  std::vector<TargetModule> out;
  for (const auto& names : modules) {
    std::vector<std::string> chosen;
    for (const auto& name : names) {
      if (target_matches(targets, false, name)) chosen.push_back(name);
    }
    // PEFT's nesting: each later stack's wrapper around the earlier one's.
    for (size_t i = 0; i < chosen.size(); ++i) {
      TargetModule t = stacks.at(chosen[i]);
      for (size_t deeper = i + 1; deeper < chosen.size(); ++deeper) t.path += ".base_layer";
      out.push_back(std::move(t));
    }
  }
  return out;
}

}  // namespace dstrain::lora
