#include "model/model_config.h"

#include <algorithm>
#include <cmath>

#include <fmt/ranges.h>

#include "core/error.h"
#include "core/fs.h"
#include "core/shared_files.h"

namespace dstrain::model {
namespace {

using nlohmann::json;

// Reads typed keys of one JSON object, naming `source` and the key path in every error.
class Reader {
 public:
  Reader(const json& obj, std::string source, std::string prefix = "")
      : obj_(obj), source_(std::move(source)), prefix_(std::move(prefix)) {}

  bool has(const std::string& key) const { return obj_.contains(key) && !obj_[key].is_null(); }

  int64_t integer(const std::string& key) const {
    if (!has(key)) bad(key, "is missing; expected an integer");
    return as_integer(key);
  }
  int64_t integer(const std::string& key, int64_t fallback) const {
    return has(key) ? as_integer(key) : fallback;
  }
  double number(const std::string& key, double fallback) const {
    if (!has(key)) return fallback;
    if (!obj_[key].is_number()) bad(key, "must be a number, got " + obj_[key].dump());
    return obj_[key].get<double>();
  }
  bool boolean(const std::string& key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!obj_[key].is_boolean()) bad(key, "must be true or false, got " + obj_[key].dump());
    return obj_[key].get<bool>();
  }
  std::string string(const std::string& key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    if (!obj_[key].is_string()) bad(key, "must be a string, got " + obj_[key].dump());
    return obj_[key].get<std::string>();
  }
  std::vector<int64_t> integers(const std::string& key) const;  // one integer or a list
  std::vector<std::string> strings(const std::string& key) const;

  [[noreturn]] void bad(const std::string& key, const std::string& what) const {
    fail(ErrorKind::kInput, "{}: key '{}{}' {}", source_, prefix_, key, what);
  }

 private:
  int64_t as_integer(const std::string& key) const {
    const json& v = obj_[key];
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>())
      return static_cast<int64_t>(v.get<double>());
    bad(key, "must be an integer, got " + v.dump());
  }

  const json& obj_;
  std::string source_;
  std::string prefix_;
};

std::vector<int64_t> Reader::integers(const std::string& key) const {
  if (!has(key)) return {};
  const json& v = obj_[key];
  if (!v.is_array()) return {as_integer(key)};
  std::vector<int64_t> out;
  for (const json& e : v) {
    if (!e.is_number_integer()) bad(key, "must be an integer or a list of integers");
    out.push_back(e.get<int64_t>());
  }
  return out;
}

std::vector<std::string> Reader::strings(const std::string& key) const {
  std::vector<std::string> out;
  if (!has(key)) return out;
  if (!obj_[key].is_array()) bad(key, "must be a list of strings");
  for (const json& e : obj_[key]) {
    if (!e.is_string()) bad(key, "must be a list of strings");
    out.push_back(e.get<std::string>());
  }
  return out;
}

// llama3's keys: the band of wavelengths blended between kept and divided by factor.
void parse_llama3(const Reader& r, RopeScaling& s) {
  s.low_freq_factor = r.number("low_freq_factor", s.low_freq_factor);
  s.high_freq_factor = r.number("high_freq_factor", s.high_freq_factor);
  s.original_max_position_embeddings = r.integer("original_max_position_embeddings");
  if (!(s.high_freq_factor > s.low_freq_factor) || !(s.low_freq_factor > 0.0))
    r.bad("high_freq_factor", "must exceed low_freq_factor, and both must be > 0");
  if (s.original_max_position_embeddings <= 0)
    r.bad("original_max_position_embeddings", "must be > 0");
}

// yarn's keys, with transformers' defaults: beta_fast 32 and beta_slow 1 (also for 0, as its
// `or` does), the original context max_position_embeddings, truncation on.
void parse_yarn(const Reader& r, int64_t max_position_embeddings, RopeScaling& s) {
  s.original_max_position_embeddings =
      r.integer("original_max_position_embeddings", max_position_embeddings);
  if (s.original_max_position_embeddings <= 0)
    r.bad("original_max_position_embeddings", "must be > 0");
  s.beta_fast = r.number("beta_fast", 0.0);
  s.beta_slow = r.number("beta_slow", 0.0);
  if (s.beta_fast == 0.0) s.beta_fast = 32.0;
  if (s.beta_slow == 0.0) s.beta_slow = 1.0;
  if (!(s.beta_fast > 0.0) || !(s.beta_slow > 0.0))
    r.bad("beta_fast", "and beta_slow must be > 0 (rotations over the original context)");
  if (r.has("attention_factor")) {
    s.attention_factor = r.number("attention_factor", 1.0);
    if (!(*s.attention_factor > 0.0)) r.bad("attention_factor", "must be > 0");
  }
  s.mscale = r.number("mscale", 0.0);
  s.mscale_all_dim = r.number("mscale_all_dim", 0.0);
  s.truncate = r.boolean("truncate", true);
}

// `rope_scaling` (older configs) or `rope_parameters` (newer ones, which also carry rope_theta).
void parse_rope(const json& doc, const std::string& source, ModelConfig& c) {
  const char* key = nullptr;
  if (doc.contains("rope_parameters") && !doc["rope_parameters"].is_null())
    key = "rope_parameters";
  else if (doc.contains("rope_scaling") && !doc["rope_scaling"].is_null())
    key = "rope_scaling";
  if (key == nullptr) return;
  if (!doc[key].is_object()) Reader(doc, source).bad(key, "must be an object");
  const Reader r(doc[key], source, std::string(key) + ".");
  c.rope_theta = r.number("rope_theta", c.rope_theta);
  RopeScaling& s = c.rope_scaling;
  s.type = r.string("rope_type", r.string("type", "default"));
  const std::vector<std::string> types = {"default", "linear", "llama3", "yarn", "dynamic"};
  if (std::find(types.begin(), types.end(), s.type) == types.end())
    r.bad("rope_type", "is '" + s.type + "'; supported: default, linear, llama3, yarn, dynamic");
  if (s.type == "default") return;
  s.factor = r.number("factor", 0.0);
  if (!(s.factor > 0.0)) r.bad("factor", "must be a number > 0");
  if (s.type == "llama3") parse_llama3(r, s);
  if (s.type == "yarn") parse_yarn(r, c.max_position_embeddings, s);
}

void parse_family_switches(const Reader& r, ModelConfig& c) {
  const bool attention_bias = r.boolean("attention_bias", false);
  if (c.model_type == "llama") {
    c.qkv_bias = c.o_bias = attention_bias;
    c.mlp_bias = r.boolean("mlp_bias", false);
  } else if (c.model_type == "qwen2") {
    c.qkv_bias = true;
  } else if (c.model_type == "qwen2_moe") {
    c.qkv_bias = r.boolean("qkv_bias", true);
  } else if (c.model_type == "qwen3" || c.model_type == "qwen3_moe") {
    c.qkv_bias = c.o_bias = attention_bias;
    c.qk_norm = true;
  }
}

// The window, as the config classes set it: MistralConfig keeps sliding_window (default 4096,
// null: none); Qwen2Config/Qwen3Config keep it (same default) only with use_sliding_window.
void parse_sliding_window(const json& doc, const Reader& r, ModelConfig& c) {
  const bool windowed =
      c.model_type == "mistral" || ((c.model_type == "qwen2" || c.model_type == "qwen3") &&
                                    r.boolean("use_sliding_window", false));
  if (!windowed) return;
  if (!doc.contains("sliding_window")) {
    c.sliding_window = 4096;
  } else if (r.has("sliding_window")) {
    c.sliding_window = r.integer("sliding_window");
  }
}

// Which layers use the window (ModelConfig::layer_types). Runs after validate(): the layer count
// and the window are known to be valid.
void parse_layer_types(const Reader& r, ModelConfig& c) {
  const auto L = static_cast<size_t>(c.num_hidden_layers);
  const bool qwen = c.model_type == "qwen2" || c.model_type == "qwen3";
  if (!qwen || !r.has("layer_types")) {
    // Qwen2Config: layers from max_window_layers on slide; mistral: all of them.
    const int64_t first = qwen ? r.integer("max_window_layers", 28) : 0;
    for (size_t i = 0; i < L; ++i) {
      const bool sliding = c.sliding_window && static_cast<int64_t>(i) >= first;
      c.layer_types.emplace_back(sliding ? kSlidingAttention : kFullAttention);
    }
    return;
  }
  const std::vector<std::string> given = r.strings("layer_types");
  if (given.size() != L)
    r.bad("layer_types", fmt::format("has {} entries; num_hidden_layers is {}", given.size(), L));
  for (size_t i = 0; i < L; ++i) {
    // "attention" is transformers' legacy name of full attention.
    const std::string& t = given[i] == "attention" ? std::string(kFullAttention) : given[i];
    if (t != kFullAttention && t != kSlidingAttention)
      r.bad("layer_types", fmt::format("[{}] is '{}'; supported: {}, {}", i, given[i],
                                       kFullAttention, kSlidingAttention));
    if (t == kSlidingAttention && !c.sliding_window)
      r.bad("layer_types", fmt::format("[{}] is {} but the model has no window (use_sliding_window "
                                       "is false or sliding_window is null)",
                                       i, kSlidingAttention));
    c.layer_types.push_back(t);
  }
}

void parse_dtype(const Reader& r, ModelConfig& c) {
  // Newer transformers write `dtype`; older ones `torch_dtype`.
  std::string d = r.string("dtype", r.string("torch_dtype", ""));
  const std::string key = r.has("dtype") ? "dtype" : "torch_dtype";
  if (d == "float" || d == "fp32") d = "float32";
  if (d == "half" || d == "fp16") d = "float16";
  if (d == "bf16") d = "bfloat16";
  if (!d.empty() && d != "float32" && d != "float16" && d != "bfloat16")
    r.bad(key, "is '" + d + "'; expected float32, bfloat16 or float16");
  c.torch_dtype = d;
}

void require_positive(const Reader& r, const std::string& key, int64_t v) {
  if (v <= 0) r.bad(key, "must be > 0, got " + std::to_string(v));
}

void validate(const Reader& r, const ModelConfig& c) {
  require_positive(r, "vocab_size", c.vocab_size);
  require_positive(r, "hidden_size", c.hidden_size);
  require_positive(r, "intermediate_size", c.intermediate_size);
  require_positive(r, "num_hidden_layers", c.num_hidden_layers);
  require_positive(r, "num_attention_heads", c.num_attention_heads);
  require_positive(r, "num_key_value_heads", c.num_key_value_heads);
  require_positive(r, "head_dim", c.head_dim);
  require_positive(r, "max_position_embeddings", c.max_position_embeddings);
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    r.bad("num_key_value_heads", fmt::format("({}) must divide num_attention_heads ({})",
                                             c.num_key_value_heads, c.num_attention_heads));
  if (!r.has("head_dim") && c.model_type != "qwen3" && c.hidden_size % c.num_attention_heads != 0)
    r.bad("num_attention_heads",
          fmt::format("({}) must divide hidden_size ({}) when head_dim is absent",
                      c.num_attention_heads, c.hidden_size));
  if (c.head_dim % 2 != 0) r.bad("head_dim", "must be even for RoPE");
  if (!(c.rms_norm_eps > 0.0)) r.bad("rms_norm_eps", "must be > 0");
  if (!(c.rope_theta > 0.0)) r.bad("rope_theta", "must be > 0");
  if (!(c.initializer_range >= 0.0)) r.bad("initializer_range", "must be >= 0");
  if (c.sliding_window && *c.sliding_window <= 0) r.bad("sliding_window", "must be > 0");
}

void parse_shape(const Reader& r, ModelConfig& c) {
  c.vocab_size = r.integer("vocab_size");
  c.hidden_size = r.integer("hidden_size");
  c.intermediate_size = r.integer("intermediate_size");
  c.num_hidden_layers = r.integer("num_hidden_layers");
  c.num_attention_heads = r.integer("num_attention_heads");
  c.num_key_value_heads = r.integer("num_key_value_heads", c.num_attention_heads);
  const int64_t default_head_dim = c.model_type == "qwen3" ? 128
                                   : c.num_attention_heads > 0
                                       ? c.hidden_size / c.num_attention_heads
                                       : 0;
  c.head_dim = r.integer("head_dim", default_head_dim);
  c.max_position_embeddings = r.integer("max_position_embeddings", c.max_position_embeddings);
  c.rms_norm_eps = r.number("rms_norm_eps", c.rms_norm_eps);
  c.rope_theta = r.number("rope_theta", c.rope_theta);
  c.initializer_range = r.number("initializer_range", c.initializer_range);
  c.tie_word_embeddings = r.boolean("tie_word_embeddings", false);
  const std::string act = r.string("hidden_act", "silu");
  if (act != "silu") r.bad("hidden_act", "is '" + act + "'; only silu (SwiGLU) is supported");
}

bool is_moe_family(const std::string& model_type) {
  return model_type == "qwen2_moe" || model_type == "qwen3_moe" || model_type == "mixtral";
}

// The experts of qwen2_moe, qwen3_moe and mixtral, with their config classes' defaults. What
// dstrain does not compute yet is refused, naming the key: a sliding window in a MoE model and
// Mixtral's router jitter.
void parse_moe(const Reader& r, ModelConfig& c) {
  if (!is_moe_family(c.model_type)) return;
  MoeConfig& m = c.moe;
  const bool mixtral = c.model_type == "mixtral";
  const bool qwen2 = c.model_type == "qwen2_moe";
  const char* experts_key = r.has("num_experts") ? "num_experts" : "num_local_experts";
  m.experts = r.integer(experts_key, mixtral ? 8 : qwen2 ? 60 : 128);
  m.top_k = r.integer("num_experts_per_tok", mixtral ? 2 : qwen2 ? 4 : 8);
  m.expert_size =
      mixtral ? c.intermediate_size : r.integer("moe_intermediate_size", qwen2 ? 1408 : 768);
  m.shared_expert_size = qwen2 ? r.integer("shared_expert_intermediate_size", 5632) : 0;
  m.norm_topk_prob = mixtral || r.boolean("norm_topk_prob", false);
  m.float32_weights = mixtral;
  m.sparse_step = mixtral ? 1 : r.integer("decoder_sparse_step", 1);
  if (!mixtral && r.has("mlp_only_layers")) m.dense_layers = r.integers("mlp_only_layers");
  m.aux_loss_coef = r.number("router_aux_loss_coef", 0.001);
  if (m.experts <= 0) r.bad(experts_key, "must be > 0, got " + std::to_string(m.experts));
  if (m.top_k <= 0 || m.top_k > m.experts)
    r.bad("num_experts_per_tok",
          fmt::format("must be between 1 and the {} experts, got {}", m.experts, m.top_k));
  require_positive(r, mixtral ? "intermediate_size" : "moe_intermediate_size", m.expert_size);
  if (qwen2) require_positive(r, "shared_expert_intermediate_size", m.shared_expert_size);
  require_positive(r, "decoder_sparse_step", m.sparse_step);
  for (int64_t layer : m.dense_layers) {
    if (layer < 0 || layer >= c.num_hidden_layers)
      r.bad("mlp_only_layers", fmt::format("holds layer {}; the model has layers 0 to {}", layer,
                                           c.num_hidden_layers - 1));
  }
  m.aux_loss = r.boolean("output_router_logits", false);
  if (mixtral && r.number("router_jitter_noise", 0.0) != 0.0)
    r.bad("router_jitter_noise", "is not 0: router jitter is not supported; set it to 0");
  const bool windowed =
      mixtral ? r.has("sliding_window")
              : r.boolean("use_sliding_window", false) || (!qwen2 && r.has("sliding_window"));
  if (windowed)
    r.bad(mixtral || !r.boolean("use_sliding_window", false) ? "sliding_window"
                                                             : "use_sliding_window",
          "sets a sliding window: MoE models train with full attention only; set it to null "
          "(false)");
}

}  // namespace

const std::vector<std::string>& supported_model_types() {
  static const std::vector<std::string> types = {"llama",     "mistral",   "qwen2",  "qwen3",
                                                 "qwen2_moe", "qwen3_moe", "mixtral"};
  return types;
}

ModelConfig parse_model_config(const json& doc, const std::string& source) {
  if (!doc.is_object()) fail(ErrorKind::kInput, "{}: expected a JSON object", source);
  const Reader r(doc, source);
  ModelConfig c;
  c.raw = doc;
  const auto& types = supported_model_types();
  const std::string supported = fmt::format("supported: {}", fmt::join(types, ", "));
  if (!r.has("model_type")) r.bad("model_type", "is missing; " + supported);
  c.model_type = r.string("model_type", "");
  if (std::find(types.begin(), types.end(), c.model_type) == types.end())
    r.bad("model_type", "is '" + c.model_type + "'; " + supported);
  c.architectures = r.strings("architectures");
  parse_shape(r, c);
  parse_rope(doc, source, c);
  parse_family_switches(r, c);
  if (!is_moe_family(c.model_type)) parse_sliding_window(doc, r, c);
  parse_dtype(r, c);
  if (r.has("bos_token_id")) c.bos_token_id = r.integer("bos_token_id");
  c.eos_token_ids = r.integers("eos_token_id");
  if (r.has("pad_token_id")) c.pad_token_id = r.integer("pad_token_id");
  validate(r, c);
  parse_moe(r, c);
  parse_layer_types(r, c);
  return c;
}

ModelConfig load_model_config(const std::filesystem::path& path) {
  const auto file = std::filesystem::is_directory(path) ? path / shared_files::kModelConfig : path;
  if (!std::filesystem::exists(file))
    fail(ErrorKind::kInput, "{}: no such file (a model directory needs a config.json)",
         file.string());
  json doc;
  try {
    doc = json::parse(fs::read_file(file));
  } catch (const json::parse_error& e) {
    fail(ErrorKind::kInput, "{}: invalid JSON: {}", file.string(), e.what());
  }
  return parse_model_config(doc, file.string());
}

bool ModelConfig::is_moe_layer(int64_t layer) const {
  if (moe.experts == 0) return false;
  if (std::find(moe.dense_layers.begin(), moe.dense_layers.end(), layer) != moe.dense_layers.end())
    return false;
  return (layer + 1) % moe.sparse_step == 0;
}

int64_t ModelConfig::moe_layer_slot(int64_t layer) const {
  int64_t before = 0;
  for (int64_t l = 0; l < layer; ++l) before += is_moe_layer(l) ? 1 : 0;
  return before;
}

int64_t ModelConfig::num_parameters(bool include_embeddings, bool active) const {
  const int64_t C = hidden_size, Q = head_dim, I = intermediate_size;
  const int64_t q_out = num_attention_heads * Q, kv_out = num_key_value_heads * Q;
  int64_t attention = C * (q_out + 2 * kv_out) + q_out * C;  // q, k, v, o
  if (qkv_bias) attention += q_out + 2 * kv_out;
  if (o_bias) attention += C;
  if (qk_norm) attention += 2 * Q;
  attention += 2 * C;                                            // input/post_attention layernorm
  const int64_t dense = 3 * C * I + (mlp_bias ? 2 * I + C : 0);  // gate, up, down
  // The router, the experts (those a token runs through when `active`), the shared expert and
  // its gate.
  const int64_t experts = active ? moe.top_k : moe.experts;
  const int64_t sparse = moe.experts * C + experts * 3 * C * moe.expert_size +
                         (moe.shared_expert_size > 0 ? 3 * C * moe.shared_expert_size + C : 0);
  int64_t total = C;  // the final norm
  for (int64_t l = 0; l < num_hidden_layers; ++l)
    total += attention + (is_moe_layer(l) ? sparse : dense);
  if (include_embeddings) total += vocab_size * C * (tie_word_embeddings ? 1 : 2);
  return total;
}

std::optional<int64_t> ModelConfig::attention_window(int64_t layer) const {
  const auto i = static_cast<size_t>(layer);
  if (i < layer_types.size() && layer_types[i] == kSlidingAttention) return sliding_window;
  return std::nullopt;
}

double ModelConfig::training_flops_per_token(int64_t seq_len) const {
  const double n = static_cast<double>(num_parameters(false, /*active=*/true)) +
                   static_cast<double>(vocab_size) * static_cast<double>(hidden_size);
  double keys = 0.0;  // summed over layers
  for (int64_t l = 0; l < num_hidden_layers; ++l) {
    const auto window = attention_window(l);
    keys += static_cast<double>(window ? std::min(seq_len, *window) : seq_len);
  }
  return 6.0 * n +
         12.0 * static_cast<double>(num_attention_heads) * static_cast<double>(head_dim) * keys;
}

json to_json(const ModelConfig& c, const std::string& dtype) {
  json j = c.raw.is_object() ? c.raw : json::object();
  j["model_type"] = c.model_type;
  if (!c.architectures.empty()) j["architectures"] = c.architectures;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["initializer_range"] = c.initializer_range;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  if (!j.contains("rope_parameters")) j["rope_theta"] = c.rope_theta;
  if (c.model_type == "llama") {
    j["attention_bias"] = c.qkv_bias;
    j["mlp_bias"] = c.mlp_bias;
  } else if (c.model_type == "qwen3") {
    j["attention_bias"] = c.qkv_bias;
  }
  const std::string d = dtype.empty() ? c.torch_dtype : dtype;
  if (!d.empty()) {
    j["torch_dtype"] = d;
    if (j.contains("dtype")) j["dtype"] = d;
  }
  if (c.bos_token_id) j["bos_token_id"] = *c.bos_token_id;
  if (c.eos_token_ids.size() == 1) j["eos_token_id"] = c.eos_token_ids[0];
  if (c.eos_token_ids.size() > 1) j["eos_token_id"] = c.eos_token_ids;
  if (c.pad_token_id) j["pad_token_id"] = *c.pad_token_id;
  return j;
}

}  // namespace dstrain::model
