// tpcli::formats — a Hugging Face config.json (and generation_config.json) as a LlamaConfig (see hf_config.h).
#include "formats/hf_config.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <map>
#include <stdexcept>

#include "files/json_file.h"
#include "formats/hf_architectures.h"

namespace tpcli::formats {

using files::quoted_value;
using files::read_json_file;

namespace fs = std::filesystem;
using nlohmann::json;

const std::vector<std::string>& supported_architectures() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const HfArchitecture& a : hf_architectures()) out.push_back(a.name);
    return out;
  }();
  return names;
}

namespace {

// Typed reads of config.json keys, with errors naming the file and the key.
class ConfigReader {
 public:
  ConfigReader(const json& j, std::string origin) : j_(j), origin_(std::move(origin)) {}

  [[noreturn]] void fail(const std::string& what) const { throw std::runtime_error(origin_ + ": " + what); }
  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  const json& at(const char* key) const {
    if (!has(key)) fail("key '" + std::string(key) + "' is missing");
    return j_.at(key);
  }
  int integer(const char* key) const {
    const json& v = at(key);
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > (int64_t{1} << 30))
      fail(std::string(key) + " = " + v.dump() + " is not an integer in [0, 2^30]");
    return v.get<int>();
  }
  int integer(const char* key, int fallback) const { return has(key) ? integer(key) : fallback; }
  float real(const char* key, float fallback) const {
    if (!has(key)) return fallback;
    const json& v = at(key);
    if (!v.is_number() || !(v.get<double>() > 0)) fail(std::string(key) + " = " + v.dump() + " is not a positive number");
    return v.get<float>();
  }
  bool boolean(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!at(key).is_boolean()) fail(std::string(key) + " = " + at(key).dump() + " is not true/false");
    return at(key).get<bool>();
  }
  std::string text(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    if (!at(key).is_string()) fail(std::string(key) + " = " + at(key).dump() + " is not a string");
    return at(key).get<std::string>();
  }
  // An id or a list of ids (eos_token_id is either).
  std::vector<int> ids(const char* key) const {
    if (!has(key)) return {};
    const json& v = at(key);
    std::vector<int> out;
    for (const json& x : v.is_array() ? v : json::array({v})) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0) fail(std::string(key) + " = " + v.dump() + " is not a token id or a list of them");
      out.push_back(x.get<int>());
    }
    return out;
  }
  const std::string& origin() const { return origin_; }

 private:
  const json& j_;
  std::string origin_;
};

std::string architecture_of(const ConfigReader& r) {
  const json& archs = r.at("architectures");
  const auto& names = supported_architectures();
  for (const json& a : archs.is_array() ? archs : json::array({archs}))
    if (a.is_string() && std::ranges::find(names, a.get<std::string>()) != names.end()) return a.get<std::string>();
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  r.fail("architectures " + archs.dump() + " is not supported (" + list + ")");
}

// Features of the Llama family tpcli does not compute: refused rather than run wrongly.
void refuse_unsupported(const ConfigReader& r, const HfArchitecture& architecture) {
  if (!architecture.qkv_bias && r.boolean("attention_bias", false)) r.fail("attention_bias = true is not supported");
  if (r.boolean("mlp_bias", false)) r.fail("mlp_bias = true is not supported");
  const std::string act = r.text("hidden_act", "silu");
  if (act != "silu") r.fail("hidden_act = " + json(act).dump() + " is not supported (only silu)");  // dump: escaped, one line
}

std::optional<nn::RopeScaling> rope_scaling_of(const ConfigReader& r) {
  if (!r.has("rope_scaling")) return std::nullopt;
  const json& j = r.at("rope_scaling");
  if (!j.is_object()) r.fail("rope_scaling = " + j.dump() + " is not an object");
  const ConfigReader s(j, r.origin());
  const std::string type = s.text("rope_type", s.text("type", ""));
  if (type == "default") return std::nullopt;
  if (type == "longrope" || type == "su")
    r.fail("rope_scaling type " + json(type).dump() + " (Phi-3's 128k-context scaling) is not supported: use the 4k-context checkpoint");
  if (type != "llama3") r.fail("rope_scaling type " + json(type).dump() + " is not supported (only llama3)");
  // As transformers: every parameter must be given (a default would silently scale by Llama 3.1's).
  for (const char* key : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
    if (!s.has(key))
      r.fail("rope_scaling (rope_type \"llama3\"): key '" + std::string(key) +
             "' is missing (llama3 needs factor, low_freq_factor, high_freq_factor and original_max_position_embeddings)");
  nn::RopeScaling out;
  out.factor = s.real("factor", out.factor);
  out.low_freq_factor = s.real("low_freq_factor", out.low_freq_factor);
  out.high_freq_factor = s.real("high_freq_factor", out.high_freq_factor);
  out.original_max_position = s.integer("original_max_position_embeddings", out.original_max_position);
  if (!(out.high_freq_factor > out.low_freq_factor))
    r.fail("rope_scaling: high_freq_factor must exceed low_freq_factor");
  return out;
}

// A MoE block's router module (model/block_matrices.h's name under an architecture's MoE block).
bool is_router_module(const std::string& module) {
  for (const HfArchitecture& a : hf_architectures())
    if (a.is_moe() && module.ends_with("." + std::string(a.moe_block) + "." + facts(model::Matrix::Router).hf_module)) return true;
  return false;
}

std::optional<model::Quantization> quantization_of(const ConfigReader& r) {
  if (!r.has("quantization")) return std::nullopt;
  const json& j = r.at("quantization");
  if (!j.is_object()) r.fail("quantization = " + j.dump() + " is not an object");
  const ConfigReader q(j, r.origin());
  model::Quantization out;
  out.bits = q.integer("bits");
  out.group_size = q.integer("group_size");
  out.mode = q.text("mode", "affine");
  if (out.mode != "affine" && out.mode != "mxfp8") r.fail("quantization mode " + quoted_value(out.mode) + " is not supported (affine, mxfp8)");
  if (out.group_size < 1 || (out.bits * out.group_size) % 32 != 0 || out.bits < 2 || out.bits > 8)
    r.fail("quantization bits = " + std::to_string(out.bits) + ", group_size = " + std::to_string(out.group_size) +
           " is not an MLX layout");
  for (const auto& [key, value] : j.items())  // per-layer overrides (mixed recipes)
    if ((value.is_object() || value.is_boolean()) && !is_router_module(key))
      r.fail("quantization override for " + json(key).dump() +
             " is not supported (one bits/group_size for every layer; MoE routers may differ)");
  return out;
}

// mlx-lm quantizes MoE routers on their own terms (8-bit, or not at all): config.json's overrides
// for them, by module path; nullopt: stored in float.
std::map<std::string, std::optional<model::Quantization>> router_quantization_of(const ConfigReader& r) {
  std::map<std::string, std::optional<model::Quantization>> out;
  if (!r.has("quantization") || !r.at("quantization").is_object()) return out;
  for (const auto& [key, value] : r.at("quantization").items()) {
    if (!is_router_module(key)) continue;
    if (value.is_boolean()) {
      if (!value.get<bool>()) out[key] = std::nullopt;
      continue;
    }
    if (!value.is_object()) continue;
    const json wrapped = {{"quantization", value}};
    out[key] = quantization_of(ConfigReader(wrapped, r.origin() + ": quantization[" + json(key).dump() + "]"));
  }
  return out;
}

// Which blocks of a MoE are dense: mlp_only_layers, and every block that decoder_sparse_step skips
// (transformers: sparse when (l + 1) % decoder_sparse_step == 0).
std::vector<int> dense_layers_of(const ConfigReader& r, int n_layers) {
  const int step = r.integer("decoder_sparse_step", 1);
  std::vector<int> dense;
  if (r.has("mlp_only_layers")) {
    const json& list = r.at("mlp_only_layers");
    if (!list.is_array()) r.fail("mlp_only_layers = " + list.dump() + " is not a list of layer indices");
    for (const json& l : list) {
      if (!l.is_number_integer() || l.get<int64_t>() < 0 || l.get<int64_t>() >= n_layers)
        r.fail("mlp_only_layers = " + list.dump() + " holds " + l.dump() + ", not a layer index in [0, num_hidden_layers)");
      dense.push_back(l.get<int>());
    }
  }
  for (int l = 0; l < n_layers; ++l)
    if (step < 1 || (l + 1) % step != 0) dense.push_back(l);
  std::ranges::sort(dense);
  dense.erase(std::unique(dense.begin(), dense.end()), dense.end());
  return dense;
}

// What the architecture computes beyond Llama's block, by its row of the table.
void set_architecture_features(const ConfigReader& r, const HfArchitecture& a, model::LlamaConfig& c) {
  c.qkv_bias = a.qkv_bias;
  c.qk_norm = a.qk_norm;
  if (!a.is_moe()) return;
  c.n_experts = r.integer(a.experts_key);
  c.top_k = r.integer("num_experts_per_tok");
  c.norm_topk_prob = a.norm_topk_prob_key ? r.boolean("norm_topk_prob", false) : true;  // transformers' defaults
  if (a.expert_hidden_key[0]) c.expert_hidden_dim = r.integer(a.expert_hidden_key);
  if (a.dense_layer_keys) c.dense_layers = dense_layers_of(r, c.n_layers);
}

model::LlamaConfig llama_config_of(const ConfigReader& r, const HfArchitecture& architecture) {
  model::LlamaConfig c;
  c.dim = r.integer("hidden_size");
  c.hidden_dim = r.integer("intermediate_size");
  c.n_layers = r.integer("num_hidden_layers");
  c.n_heads = r.integer("num_attention_heads");
  c.n_kv_heads = r.integer("num_key_value_heads", c.n_heads);
  c.vocab_size = r.integer("vocab_size");
  c.seq_len = r.integer("max_position_embeddings");
  // Sliding-window attention is not computed: within the window it equals full attention, so the
  // context is limited to the window and stays exact.
  const bool windowed = !architecture.sliding_window_switch || r.boolean("use_sliding_window", false);
  if (r.has("sliding_window") && windowed) c.seq_len = std::min(c.seq_len, r.integer("sliding_window"));
  c.norm_eps = r.real("rms_norm_eps", 1e-6f);
  c.rope_theta = r.real("rope_theta", 10000.0f);
  c.rope_scaling = rope_scaling_of(r);
  c.shared_classifier = r.boolean("tie_word_embeddings", false);  // transformers' LlamaConfig default
  c.quantization = quantization_of(r);
  // head_dim only where it is not hidden_size / num_attention_heads (then q_proj has NH * head_dim rows).
  if (r.has("head_dim") && c.n_heads > 0 && r.integer("head_dim") * c.n_heads != c.dim) c.head_dim = r.integer("head_dim");
  set_architecture_features(r, architecture, c);
  if (std::string(architecture.name) != "LlamaForCausalLM") c.hf_architecture = architecture.name;
  try {
    c.validate();
  } catch (const std::invalid_argument& e) {
    r.fail(e.what());
  }
  return c;
}

}  // namespace

bool is_hf_model_dir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::exists(fs::path(path) / "config.json", ec);
}

HfConfig read_hf_config(const std::string& dir) {
  const std::string path = (fs::path(dir) / "config.json").string();
  if (!fs::exists(path)) throw std::runtime_error(path + ": missing: not a Hugging Face model directory?");
  const json j = read_json_file(path, "a Hugging Face config.json");
  if (!j.is_object()) throw std::runtime_error(path + ": not a JSON object");
  const ConfigReader r(j, path);
  HfConfig out;
  out.architecture = architecture_of(r);
  const HfArchitecture& architecture = hf_architecture(out.architecture);
  refuse_unsupported(r, architecture);
  out.llama = llama_config_of(r, architecture);
  out.router_quantization = router_quantization_of(r);
  out.torch_dtype = r.text("torch_dtype", "");
  if (auto bos = r.ids("bos_token_id"); !bos.empty()) out.bos_token_id = bos.front();
  out.eos_token_ids = r.ids("eos_token_id");
  std::string eos_origin = path;  // the file the ids come from, for the range check's error
  const std::string gen_path = (fs::path(dir) / "generation_config.json").string();
  if (fs::exists(gen_path)) {  // generation_config.json wins: it is what generate() uses
    const json g = read_json_file(gen_path, "a generation_config.json");
    if (!g.is_object()) throw std::runtime_error(gen_path + ": not a JSON object");
    const ConfigReader gr(g, gen_path);
    if (auto bos = gr.ids("bos_token_id"); !bos.empty()) out.bos_token_id = bos.front();
    if (auto eos = gr.ids("eos_token_id"); !eos.empty()) {
      out.eos_token_ids = eos;
      eos_origin = gen_path;
    }
  }
  for (int id : out.eos_token_ids)
    if (id >= out.llama.vocab_size)
      throw std::runtime_error(eos_origin + ": eos_token_id " + std::to_string(id) + " is outside the vocabulary (" +
                               std::to_string(out.llama.vocab_size) + " in config.json)");
  return out;
}

}  // namespace tpcli::formats
