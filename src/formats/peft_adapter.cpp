// tpcli::formats — Hugging Face PEFT's LoRA adapter folder (see peft_adapter.h).
#include "formats/peft_adapter.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <regex>
#include <set>
#include <stdexcept>

#include "files/atomic_file.h"
#include "files/json_file.h"
#include "formats/dtype.h"
#include "formats/hf_names.h"
#include "formats/safetensors.h"

namespace tpcli::formats {

using files::quoted_value;
using files::read_json_file;
using files::write_atomically;
using model::lora_matrix_order;
using model::lora_tensor_name;
using model::matrix_of_peft;
using model::parse_lora_key;
using model::tensor_name;

namespace fs = std::filesystem;
using nlohmann::json;
using tensor::Tensor;

namespace {

constexpr const char* CONFIG_FILE = "adapter_config.json";
constexpr const char* WEIGHTS_FILE = "adapter_model.safetensors";
constexpr const char* PEFT_PREFIX = "base_model.model.";

// W's shape [OUT, IN] of matrix m.
std::pair<int64_t, int64_t> matrix_shape(model::Matrix m, const model::LlamaConfig& c) {
  const tensor::Shape s = block_shape(m, c);
  return {s[0], s[1]};
}

bool is_ffn(model::Matrix m) { return facts(m).blocks == model::Blocks::Dense; }
const char* peft_name(model::Matrix m) { return facts(m).peft; }

std::string architecture_of(const model::LlamaConfig& c) { return c.hf_architecture.empty() ? "LlamaForCausalLM" : c.hf_architecture; }

// Where block l's matrix m lives in a Hugging Face directory, for PEFT's names: one module, not a
// fused segment (Phi-3's qkv_proj would need an adapter over the fused rows).
HfTensorRef peft_module(int l, model::Matrix m, const model::LlamaConfig& c) {
  HfTensorRef ref = hf_tensor_of(model::BlockKey{l, m}, c, architecture_of(c));
  if (ref.modules.size() != 1 || ref.fused_rows != 0)
    throw std::invalid_argument(architecture_of(c) + " stores " + facts(m).name + " in a fused module (" + ref.modules.at(0) +
                                "): PEFT adapters on it are not supported");
  return ref;
}

std::string shape_text(int64_t a, int64_t b) { return tensor::to_string(tensor::Shape{a, b}); }

// B [OUT, r] rows reordered between the RoPE layouts (rope_heads 0: copied).
std::vector<float> rope_rows(std::span<const float> b, int rope_heads, int head_size, int64_t r, bool to_hf) {
  std::vector<float> out(b.begin(), b.end());
  if (rope_heads == 0) return out;
  const size_t row_bytes = static_cast<size_t>(r) * sizeof(float);
  auto* dst = reinterpret_cast<std::byte*>(out.data());
  const auto* src = reinterpret_cast<const std::byte*>(b.data());
  if (to_hf) rope_rows_to_hf(dst, src, rope_heads, head_size, row_bytes);
  else rope_rows_from_hf(dst, src, rope_heads, head_size, row_bytes);
  return out;
}

void write_json(const std::string& path, const json& j) {
  write_atomically(path, [&](std::ostream& out) { out << j.dump(2) << "\n"; });
}

// ---- reading adapter_config.json ----

class AdapterConfigReader {
 public:
  AdapterConfigReader(const json& j, std::string path) : j_(j), path_(std::move(path)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw std::runtime_error(path_ + ": " + key + ": " + what);
  }
  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  const json& at(const char* key) const {
    if (!has(key)) fail(key, "missing");
    return j_.at(key);
  }
  double number(const char* key) const {
    const json& v = at(key);
    if (!v.is_number() || !std::isfinite(v.get<double>())) fail(key, quoted_value(v.dump()) + " is not a finite number");
    return v.get<double>();
  }
  int64_t integer(const char* key) const {
    const json& v = at(key);
    if (!v.is_number_integer()) fail(key, quoted_value(v.dump()) + " is not an integer");
    return v.get<int64_t>();
  }
  std::string string(const char* key) const {
    const json& v = at(key);
    if (!v.is_string()) fail(key, quoted_value(v.dump()) + " is not a string");
    return v.get<std::string>();
  }
  // A key tpcli cannot honour unless it holds `inactive` (or is absent, or null).
  void require_inactive(const char* key, const json& inactive, const std::string& why) const {
    if (has(key) && j_.at(key) != inactive) fail(key, value_text(j_.at(key)) + ": " + why);
  }
  void require_empty(const char* key, const std::string& why) const {
    if (has(key) && !j_.at(key).empty()) fail(key, value_text(j_.at(key)) + ": " + why);
  }
  // A value as JSON on one line, cut to 100 bytes.
  static std::string value_text(const json& v) {
    const std::string text = v.dump();
    return text.size() <= 100 ? text : text.substr(0, 100) + "...";
  }

 private:
  const json& j_;
  std::string path_;
};

void read_adapter_config(model::LoraAdapterSet& set, std::optional<std::set<int>>& layers, const std::string& path) {
  const json j = read_json_file(path, "a PEFT adapter_config.json");
  if (!j.is_object()) throw std::runtime_error(path + ": not a JSON object");
  const AdapterConfigReader r(j, path);
  if (const std::string type = r.string("peft_type"); type != "LORA")
    r.fail("peft_type", quoted_value(type) + ": only LORA adapters are supported");
  if (r.has("task_type") && r.string("task_type") != "CAUSAL_LM")
    r.fail("task_type", quoted_value(r.string("task_type")) + ": expected CAUSAL_LM");
  const int64_t rank = r.integer("r");
  if (rank < 1 || rank > 65536) r.fail("r", std::to_string(rank) + " outside [1, 65536]");
  set.rank = static_cast<int>(rank);
  set.alpha = r.number("lora_alpha");
  set.dropout = r.has("lora_dropout") ? r.number("lora_dropout") : 0.0;
  if (r.has("base_model_name_or_path")) set.base_model = r.string("base_model_name_or_path");
  r.require_inactive("use_dora", false, "DoRA adapters are not supported");
  r.require_inactive("use_rslora", false, "rsLoRA's scale alpha / sqrt(r) is not supported");
  r.require_inactive("bias", "none", "LoRA bias terms are not supported");
  r.require_inactive("fan_in_fan_out", false, "Conv1D (GPT-2) weights are not Llama's");
  r.require_empty("rank_pattern", "per-module ranks are not supported");
  r.require_empty("alpha_pattern", "per-module alphas are not supported");
  r.require_empty("modules_to_save", "fully trained modules beside the adapters are not supported");
  r.require_inactive("layer_replication", nullptr, "layer replication is not supported");
  const json& targets = r.at("target_modules");
  if (!targets.is_array() || targets.empty())
    r.fail("target_modules", quoted_value(targets.dump()) + ": expected a list of module names (a regex string is not supported)");
  for (const json& t : targets) {
    if (!t.is_string()) r.fail("target_modules", quoted_value(t.dump()) + " is not a string");
    set.targets.push_back(t.get<std::string>());
  }
  if (r.has("layers_to_transform")) {
    const json& v = j.at("layers_to_transform");
    layers.emplace();
    for (const json& x : v.is_array() ? v : json::array({v})) {
      if (!x.is_number_integer()) r.fail("layers_to_transform", quoted_value(x.dump()) + " is not a layer index");
      layers->insert(x.get<int>());
    }
  }
}

// The tensor file's name for block l's module as PEFT writes it, without the prefix.
std::optional<model::LoraKey> parse_peft_name(std::string name) {
  if (name.starts_with(PEFT_PREFIX)) name = name.substr(std::strlen(PEFT_PREFIX));
  static const std::regex re(R"(model\.layers\.(\d{1,6})\.(self_attn|mlp)\.(\w+)\.lora_(A|B)\.weight)");
  std::smatch m;
  if (!std::regex_match(name, m, re)) return std::nullopt;
  const std::string module = m[2].str() + "." + m[3].str();
  for (model::Matrix matrix : lora_matrix_order())
    if (module == facts(matrix).hf_module) return model::LoraKey{{std::stoi(m[1].str()), matrix}, m[4].str() == "A" ? 'a' : 'b'};
  return std::nullopt;
}

// One tensor of PEFT's file, checked against the model and the config (one-line errors naming the
// file and the tensor): its tpcli name and value, lora_B's rows in tpcli's RoPE order.
std::pair<std::string, Tensor> read_peft_tensor(const SafetensorsFile& file, const std::string& name, int64_t r,
                                                const std::set<model::Matrix>& targets,
                                                const std::optional<std::set<int>>& layers_to_transform, const model::LlamaConfig& c) {
  auto fail = [&](const std::string& what) { throw std::runtime_error(file.path() + ": tensor " + name + ": " + what); };
  const auto k = parse_peft_name(name);
  if (!k) fail("not a LoRA lora_A / lora_B weight of a Llama block's q_proj k_proj v_proj o_proj gate_proj up_proj down_proj");
  const std::string hf = peft_name(k->matrix()), layer = std::to_string(k->layer());
  if (!targets.count(k->matrix())) fail(hf + " is not in target_modules");
  if (k->layer() >= c.n_layers) fail("layer " + layer + " beyond the model's " + std::to_string(c.n_layers));
  if (layers_to_transform && !layers_to_transform->count(k->layer())) fail("layer " + layer + " is not in layers_to_transform");
  if (is_ffn(k->matrix()) && c.is_moe_layer(k->layer())) fail("layer " + layer + " is a mixture of experts, with no dense " + hf);
  HfTensorRef ref;
  try {
    ref = peft_module(k->layer(), k->matrix(), c);
  } catch (const std::invalid_argument& e) {
    fail(e.what());
  }
  const model::StoredTensor st = *file.stored(name);
  if (!is_float(st.dtype)) fail("dtype is not F32, F16 or BF16");
  const auto [OUT, IN] = matrix_shape(k->matrix(), c);
  const bool a = k->side == 'a';
  const tensor::Shape want = a ? tensor::Shape{r, IN} : tensor::Shape{OUT, r};
  const size_t rank_axis = a ? 0 : 1, feature_axis = 1 - rank_axis;
  if (st.shape.size() == 2 && st.shape[rank_axis] != r && st.shape[feature_axis] == want[feature_axis])
    fail("rank " + std::to_string(st.shape[rank_axis]) + " but adapter_config.json says r = " + std::to_string(r));
  if (st.shape != want)
    fail("shape " + tensor::to_string(st.shape) + ", expected " + tensor::to_string(want) + " for this model (" + hf + " is " +
         shape_text(OUT, IN) + ", r = " + std::to_string(r) + ")");
  const std::span<const float> v = file.get(name);
  for (size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i])) fail("non-finite value at element " + std::to_string(i));
  const std::vector<float> values = a ? std::vector<float>(v.begin(), v.end()) : rope_rows(v, ref.rope_heads, c.head_size(), r, false);
  return {lora_tensor_name(k->key, k->side), Tensor(want, values)};
}

}  // namespace

void save_peft_adapter(const std::string& dir, const model::LoraAdapterSet& set, const model::LlamaConfig& c) {
  validate_lora(set, c, dir);
  const std::vector<int> layers = adapted_layers(set);
  if (layers.empty()) throw std::invalid_argument(dir + ": the adapter holds no tensors");
  std::vector<std::string> targets;  // tpcli's order, HF names
  for (model::Matrix m : lora_matrix_order())
    for (const auto& t : set.targets)
      if (matrix_of_peft(t) == m) targets.push_back(t);
  const int64_t r = set.rank;
  std::vector<std::vector<float>> values;  // kept alive until written
  std::vector<TensorView> views;
  values.reserve(layers.size() * targets.size() * 2);
  for (int l : layers)
    for (const auto& t : targets) {
      const model::Matrix m = *matrix_of_peft(t);
      const std::string base = tensor_name({l, m});
      if (is_ffn(m) && c.is_moe_layer(l)) continue;  // a MoE block has no dense feed-forward to adapt
      if (!lora_adapts(set, base))
        throw std::invalid_argument(dir + ": layer " + std::to_string(l) + " has adapters but none on " + t +
                                    ": PEFT adapts every target module of every adapted layer");
      const HfTensorRef ref = peft_module(l, m, c);
      const auto [OUT, IN] = matrix_shape(m, c);
      const std::string peft = PEFT_PREFIX + ref.modules[0];
      const Tensor& a = set.tensors.at(base + ".lora_a");
      const Tensor& b = set.tensors.at(base + ".lora_b");
      values.emplace_back(a.span().begin(), a.span().end());
      views.push_back({peft + ".lora_A.weight", {r, IN}, values.back()});
      values.push_back(rope_rows(b.span(), ref.rope_heads, c.head_size(), r, true));
      views.push_back({peft + ".lora_B.weight", {OUT, r}, values.back()});
    }
  json config = {{"peft_type", "LORA"},
                 {"task_type", "CAUSAL_LM"},
                 {"r", set.rank},
                 {"lora_alpha", set.alpha == std::floor(set.alpha) && std::abs(set.alpha) < 1e15 ? json(static_cast<int64_t>(set.alpha))
                                                                                        : json(set.alpha)},
                 {"lora_dropout", set.dropout},
                 {"target_modules", targets},
                 {"base_model_name_or_path", set.base_model.empty() ? json(nullptr) : json(set.base_model)},
                 {"bias", "none"},
                 {"fan_in_fan_out", false},
                 {"use_rslora", false},
                 {"use_dora", false},
                 {"inference_mode", true},
                 {"init_lora_weights", true},
                 {"modules_to_save", nullptr},
                 {"rank_pattern", json::object()},
                 {"alpha_pattern", json::object()},
                 {"layers_to_transform", nullptr},
                 {"layers_pattern", nullptr},
                 {"revision", nullptr}};
  if (static_cast<int>(layers.size()) != c.n_layers) {
    config["layers_to_transform"] = layers;
    config["layers_pattern"] = "layers";
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir)) throw std::runtime_error(dir + ": cannot create the folder" + (ec ? ": " + ec.message() : ""));
  write_safetensors((fs::path(dir) / WEIGHTS_FILE).string(), views, Metadata{{"format", "pt"}});
  write_json((fs::path(dir) / CONFIG_FILE).string(), config);
}

model::LoraAdapterSet load_peft_adapter(const std::string& dir, const model::LlamaConfig& c) {
  if (!fs::is_directory(dir)) throw std::runtime_error(dir + ": not a folder (expected a PEFT adapter folder with " + CONFIG_FILE + ")");
  const std::string config_path = (fs::path(dir) / CONFIG_FILE).string(), weights_path = (fs::path(dir) / WEIGHTS_FILE).string();
  if (!fs::exists(config_path)) throw std::runtime_error(config_path + ": missing (not a PEFT adapter folder)");
  if (!fs::exists(weights_path)) {
    if (fs::exists(fs::path(dir) / "adapter_model.bin"))
      throw std::runtime_error(weights_path + ": missing; adapter_model.bin (a pickle) is not read: save with safe_serialization=True");
    throw std::runtime_error(weights_path + ": missing");
  }
  model::LoraAdapterSet set;
  std::optional<std::set<int>> layers_to_transform;
  read_adapter_config(set, layers_to_transform, config_path);
  std::set<model::Matrix> targets;
  for (const auto& t : set.targets) {
    const auto m = matrix_of_peft(t);
    if (!m)
      throw std::runtime_error(config_path + ": target_modules: " + quoted_value(t) +
                               " is not one of q_proj k_proj v_proj o_proj gate_proj up_proj down_proj");
    targets.insert(*m);
  }
  const SafetensorsFile file(weights_path);
  std::set<model::Matrix> seen_matrices;
  for (const std::string& name : file.names()) {
    const auto [key, tensor] = read_peft_tensor(file, name, set.rank, targets, layers_to_transform, c);
    if (!set.tensors.emplace(key, tensor).second)
      throw std::runtime_error(weights_path + ": tensor " + name + ": a second " + key + " (with and without base_model.model.?)");
    seen_matrices.insert(parse_lora_key(key)->matrix());
  }
  for (const auto& [name, t] : set.tensors) {
    const auto k = parse_lora_key(name);
    if (!set.tensors.count(lora_tensor_name(k->key, k->side == 'a' ? 'b' : 'a')))
      throw std::runtime_error(weights_path + ": " + peft_name(k->matrix()) + " of layer " + std::to_string(k->layer()) +
                               " has lora_" + (k->side == 'a' ? "A" : "B") + " but no lora_" + (k->side == 'a' ? "B" : "A"));
  }
  for (const auto& m : targets)
    if (!seen_matrices.count(m))
      throw std::runtime_error(weights_path + ": target module " + peft_name(m) + " (adapter_config.json) has no tensors");
  try {
    validate_lora(set, c, dir);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(e.what());
  }
  return set;
}

// ---- AdaptedWeights ----
}  // namespace tpcli::formats
