#include "model/hf_model.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>
#include <stdexcept>

#include "model/atomic_file.h"
#include "model/dtype.h"
#include "model/json_file.h"
#include "model/packed_weights.h"

namespace tpcli::model {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const char* const INDEX_FILE = "model.safetensors.index.json";

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
  for (const json& a : archs.is_array() ? archs : json::array({archs}))
    if (a == "LlamaForCausalLM" || a == "MistralForCausalLM") return a.get<std::string>();
  r.fail("architectures " + archs.dump() + " is not supported (LlamaForCausalLM, MistralForCausalLM)");
}

// Features of the Llama family tpcli does not compute: refused rather than run wrongly.
void refuse_unsupported(const ConfigReader& r) {
  if (r.boolean("attention_bias", false)) r.fail("attention_bias = true is not supported");
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
  if (type != "llama3") r.fail("rope_scaling type " + json(type).dump() + " is not supported (only llama3)");
  nn::RopeScaling out;
  out.factor = s.real("factor", out.factor);
  out.low_freq_factor = s.real("low_freq_factor", out.low_freq_factor);
  out.high_freq_factor = s.real("high_freq_factor", out.high_freq_factor);
  out.original_max_position = s.integer("original_max_position_embeddings", out.original_max_position);
  if (!(out.high_freq_factor > out.low_freq_factor))
    r.fail("rope_scaling: high_freq_factor must exceed low_freq_factor");
  return out;
}

std::optional<Quantization> quantization_of(const ConfigReader& r) {
  if (!r.has("quantization")) return std::nullopt;
  const json& j = r.at("quantization");
  if (!j.is_object()) r.fail("quantization = " + j.dump() + " is not an object");
  const ConfigReader q(j, r.origin());
  Quantization out;
  out.bits = q.integer("bits");
  out.group_size = q.integer("group_size");
  out.mode = q.text("mode", "affine");
  if (out.mode != "affine" && out.mode != "mxfp8") r.fail("quantization mode " + quoted_value(out.mode) + " is not supported (affine, mxfp8)");
  if (out.group_size < 1 || (out.bits * out.group_size) % 32 != 0 || out.bits < 2 || out.bits > 8)
    r.fail("quantization bits = " + std::to_string(out.bits) + ", group_size = " + std::to_string(out.group_size) +
           " is not an MLX layout");
  for (const auto& [key, value] : j.items())  // per-layer overrides (mixed recipes)
    if (value.is_object() || value.is_boolean())
      r.fail("quantization override for " + json(key).dump() + " is not supported (one bits/group_size for every layer)");
  return out;
}

LlamaConfig llama_config_of(const ConfigReader& r) {
  LlamaConfig c;
  c.dim = r.integer("hidden_size");
  c.hidden_dim = r.integer("intermediate_size");
  c.n_layers = r.integer("num_hidden_layers");
  c.n_heads = r.integer("num_attention_heads");
  c.n_kv_heads = r.integer("num_key_value_heads", c.n_heads);
  c.vocab_size = r.integer("vocab_size");
  c.seq_len = r.integer("max_position_embeddings");
  // Mistral's sliding-window attention is not computed: within the window it equals full
  // attention, so the context is limited to the window and stays exact.
  if (r.has("sliding_window")) c.seq_len = std::min(c.seq_len, r.integer("sliding_window"));
  c.norm_eps = r.real("rms_norm_eps", 1e-6f);
  c.rope_theta = r.real("rope_theta", 10000.0f);
  c.rope_scaling = rope_scaling_of(r);
  c.shared_classifier = r.boolean("tie_word_embeddings", false);  // transformers' LlamaConfig default
  c.quantization = quantization_of(r);
  // head_dim only where it is not hidden_size / num_attention_heads (then q_proj has NH * head_dim rows).
  if (r.has("head_dim") && c.n_heads > 0 && r.integer("head_dim") * c.n_heads != c.dim) c.head_dim = r.integer("head_dim");
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
  refuse_unsupported(r);
  out.llama = llama_config_of(r);
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

// ---- the RoPE row order ----

void rope_rows_from_hf(std::byte* out, const std::byte* in, int heads, int head_size, size_t row_bytes) {
  const int half = head_size / 2;
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < half; ++i)
      for (int j = 0; j < 2; ++j)
        std::memcpy(out + static_cast<size_t>(h * head_size + 2 * i + j) * row_bytes,
                    in + static_cast<size_t>(h * head_size + j * half + i) * row_bytes, row_bytes);
}

void rope_rows_to_hf(std::byte* out, const std::byte* in, int heads, int head_size, size_t row_bytes) {
  const int half = head_size / 2;
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < half; ++i)
      for (int j = 0; j < 2; ++j)
        std::memcpy(out + static_cast<size_t>(h * head_size + j * half + i) * row_bytes,
                    in + static_cast<size_t>(h * head_size + 2 * i + j) * row_bytes, row_bytes);
}

namespace {

// tpcli parameter name -> Hugging Face module path (the tensor is PATH.weight), and how many heads
// of rows to reorder for RoPE (0: none).
struct HfModule {
  std::string path;
  int rope_heads = 0;
};

HfModule hf_module_of(const std::string& name, const LlamaConfig& c) {
  if (name == "tok_embeddings") return {"model.embed_tokens"};
  if (name == "norm") return {"model.norm"};
  if (name == "output") return {"lm_head"};
  static const std::map<std::string, std::string> per_layer{
      {"attention_norm", "input_layernorm"}, {"wq", "self_attn.q_proj"}, {"wk", "self_attn.k_proj"},
      {"wv", "self_attn.v_proj"},            {"wo", "self_attn.o_proj"}, {"ffn_norm", "post_attention_layernorm"},
      {"w1", "mlp.gate_proj"},               {"w2", "mlp.down_proj"},    {"w3", "mlp.up_proj"}};
  const size_t dot = name.find('.', 7);  // "layers.{i}.{kind}"
  if (name.starts_with("layers.") && dot != std::string::npos) {
    const std::string kind = name.substr(dot + 1);
    if (auto it = per_layer.find(kind); it != per_layer.end()) {
      const int heads = kind == "wq" ? c.n_heads : kind == "wk" ? c.n_kv_heads : 0;
      return {"model." + name.substr(0, dot) + "." + it->second, heads};
    }
  }
  throw std::invalid_argument("hf: parameter '" + name + "' has no Hugging Face Llama name");
}

std::string shape_text(const tensor::Shape& s) { return tensor::to_string(s); }

// MLX quantizes every matrix whose input dimension its group divides and leaves the rest (and the
// norms) in float: a matrix it would have quantized but that is stored in float contradicts a
// config.json that states a quantization, and would run unquantized while `inspect` said otherwise.
bool mlx_would_quantize(const ParamSpec& p, const Quantization& q) {
  return p.shape.size() == 2 && q.group_size > 0 && p.shape[1] % q.group_size == 0;
}

}  // namespace

// ---- reading ----

HfModelDir::HfModelDir(const std::string& dir) : dir_(dir), hf_(read_hf_config(dir)) {
  open_files();
  map_parameters();
}

HfModelDir::~HfModelDir() = default;

// model.safetensors.index.json's weight_map (sharded), else model.safetensors alone.
void HfModelDir::open_files() {
  const fs::path index_path = fs::path(dir_) / INDEX_FILE;
  if (!fs::exists(index_path)) {
    const fs::path single = fs::path(dir_) / "model.safetensors";
    if (!fs::exists(single))
      throw std::runtime_error(single.string() + ": missing (and no " + INDEX_FILE + " lists shards)");
    files_.push_back(std::make_unique<SafetensorsFile>(single.string()));
    for (const auto& name : files_.back()->names()) file_of_[name] = files_.back().get();
    return;
  }
  const json index = read_json_file(index_path.string(), std::string("a ") + INDEX_FILE);
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
    throw std::runtime_error(index_path.string() + ": no \"weight_map\" object");
  std::map<std::string, const SafetensorsFile*> opened;
  for (const auto& [tensor_name, file_json] : index["weight_map"].items()) {
    if (!file_json.is_string()) throw std::runtime_error(index_path.string() + ": weight_map[" + quoted_value(tensor_name) + "] is not a file name");
    const std::string file = file_json.get<std::string>();
    if (file.find('/') != std::string::npos || file.starts_with("."))
      throw std::runtime_error(index_path.string() + ": shard name " + quoted_value(file) + " is not a plain file name");
    if (!opened.count(file)) {
      const fs::path shard = fs::path(dir_) / file;
      if (!fs::exists(shard))
        throw std::runtime_error(shard.string() + ": missing, but " + INDEX_FILE + " lists it (for " + quoted_value(tensor_name) + ")");
      files_.push_back(std::make_unique<SafetensorsFile>(shard.string()));
      opened[file] = files_.back().get();
    }
    if (!opened[file]->has(tensor_name))
      throw std::runtime_error(opened[file]->path() + ": tensor " + quoted_value(tensor_name) + " is missing, but " + INDEX_FILE +
                               " places it here");
    file_of_[tensor_name] = opened[file];
  }
}

void HfModelDir::add_source(const std::string& name, const std::string& hf_name, int rope_heads) {
  auto it = file_of_.find(hf_name);
  if (it == file_of_.end()) {
    const std::string where = files_.size() == 1 ? files_.front()->path() : (fs::path(dir_) / INDEX_FILE).string();
    throw std::runtime_error(where + ": tensor '" + hf_name + "' is missing");
  }
  sources_[name] = {it->second, hf_name, rope_heads};
}

// Every parameter's source, with its dtype and shape checked (quantized: words, scales, biases).
void HfModelDir::map_parameters() {
  const LlamaConfig& c = hf_.llama;
  for (const ParamSpec& p : llama_parameters(c)) {
    const HfModule m = hf_module_of(p.name, c);
    add_source(p.name, m.path + ".weight", m.rope_heads);
    const Source& s = sources_.at(p.name);
    const StoredTensor t = *s.file->stored(s.hf_name);
    auto bad = [&](const std::string& what) {
      return std::runtime_error(s.file->path() + ": tensor '" + s.hf_name + "' " + what);
    };
    const bool quantized = c.quantization && file_of_.count(m.path + ".scales");
    if (!quantized) {
      if (!is_float(t.dtype)) throw bad(std::string("is ") + dtype_name(t.dtype) + " (no .scales beside it): not a float weight");
      if (c.quantization && mlx_would_quantize(p, *c.quantization))
        throw bad(std::string("is ") + dtype_name(t.dtype) + " with no .scales beside it, but config.json's quantization (" +
                  c.quantization->mode + ", " + std::to_string(c.quantization->bits) + " bits, group_size " +
                  std::to_string(c.quantization->group_size) + ") says it is quantized: the weights do not match config.json");
      if (t.shape != p.shape) throw bad("has shape " + shape_text(t.shape) + ", config.json implies " + shape_text(p.shape));
      continue;
    }
    const Quantization& q = *c.quantization;
    const int64_t rows = p.shape[0], cols = p.shape[1];
    if (t.dtype != DType::U32 || t.shape != tensor::Shape{rows, cols * q.bits / 32})
      throw bad(std::string("is ") + dtype_name(t.dtype) + " " + shape_text(t.shape) + ", a " + std::to_string(q.bits) +
                "-bit quantized " + shape_text(p.shape) + " needs U32 " + shape_text({rows, cols * q.bits / 32}));
    for (const char* part : {".scales", ".biases"}) {
      if (q.mode != "affine" && std::string(part) == ".biases") continue;
      add_source(p.name + part, m.path + part, m.rope_heads);
      const Source& ps = sources_.at(p.name + part);
      const StoredTensor pt = *ps.file->stored(ps.hf_name);
      if (pt.shape != tensor::Shape{rows, cols / q.group_size})
        throw std::runtime_error(ps.file->path() + ": tensor '" + ps.hf_name + "' has shape " + shape_text(pt.shape) +
                                 ", group_size " + std::to_string(q.group_size) + " needs " +
                                 shape_text({rows, cols / q.group_size}));
      if (q.mode == "affine" ? !is_float(pt.dtype) : pt.dtype != DType::U8)
        throw std::runtime_error(ps.file->path() + ": tensor '" + ps.hf_name + "' has dtype " + dtype_name(pt.dtype));
    }
  }
  if (c.shared_classifier)  // the classifier is the embedding: the same source under both names
    for (const char* part : {"", ".scales", ".biases"})
      if (sources_.count(std::string("tok_embeddings") + part))
        sources_[std::string("output") + part] = sources_.at(std::string("tok_embeddings") + part);
}

const HfModelDir::Source& HfModelDir::source(const std::string& name) const {
  auto it = sources_.find(name);
  if (it == sources_.end()) throw std::out_of_range(dir_ + ": no parameter named '" + name + "'");
  return it->second;
}

std::optional<StoredTensor> HfModelDir::stored(const std::string& name) const {
  auto it = sources_.find(name);
  if (it == sources_.end()) return std::nullopt;
  const Source& s = it->second;
  StoredTensor t = *s.file->stored(s.hf_name);
  if (s.rope_heads == 0) return t;
  std::lock_guard lock(reordered_mutex_);
  auto [slot, fresh] = reordered_.try_emplace(s.hf_name);
  if (fresh) {
    const size_t bytes = static_cast<size_t>(tensor::numel(t.shape)) * dtype_bytes(t.dtype);
    slot->second.resize(bytes);
    rope_rows_from_hf(slot->second.data(), static_cast<const std::byte*>(t.data), s.rope_heads, hf_.llama.head_size(),
                      bytes / static_cast<size_t>(t.shape[0]));
  }
  t.data = slot->second.data();
  return t;
}

namespace {

std::vector<float> to_f32_vector(const StoredTensor& t) {
  std::vector<float> out(static_cast<size_t>(tensor::numel(t.shape)));
  to_f32(out.data(), t.data, t.dtype, tensor::numel(t.shape));
  return out;
}

}  // namespace

// A quantized weight in f32: the (reordered) words with the (reordered) scales and biases,
// dequantized by tensor::PackedMatrix (MLX's rules, ../shared/QUANT.md).
std::vector<float> HfModelDir::dequantized(const std::string& name) const {
  const tensor::Tensor w = load_packed_full(*this, name).dequantize();
  return {w.span().begin(), w.span().end()};
}

std::span<const float> HfModelDir::get(const std::string& name) const {
  const Source& s = source(name);
  const StoredTensor raw = *s.file->stored(s.hf_name);
  if (raw.dtype == DType::F32 && s.rope_heads == 0)
    return {static_cast<const float*>(raw.data), static_cast<size_t>(tensor::numel(raw.shape))};
  // One conversion per tensor, whichever device asks first; the others wait and share it.
  std::lock_guard lock(converted_mutex_);
  auto [slot, fresh] = converted_.try_emplace(s.hf_name);
  if (fresh) slot->second = is_float(raw.dtype) ? to_f32_vector(*stored(name)) : dequantized(name);
  return slot->second;
}

void HfModelDir::release_conversions() const {
  std::scoped_lock lock(converted_mutex_, reordered_mutex_);
  converted_.clear();
  reordered_.clear();
}

// ---- writing ----

namespace {

// A float as the shortest decimal that reads back as the same float (1e-05, not 9.99999974737875e-06).
double decimal(float v) {
  char buf[32];
  for (int digits = 6; digits <= 9; ++digits) {
    std::snprintf(buf, sizeof(buf), "%.*g", digits, static_cast<double>(v));
    if (std::strtof(buf, nullptr) == v) break;
  }
  return std::strtod(buf, nullptr);
}

const char* torch_dtype_name(DType d) {
  return d == DType::BF16 ? "bfloat16" : d == DType::F16 ? "float16" : "float32";
}

json id_or_list(const std::vector<int>& ids) { return ids.size() == 1 ? json(ids.front()) : json(ids); }

json hf_config_json(const LlamaConfig& c, const HfExportOptions& o) {
  json j = {{"architectures", {"LlamaForCausalLM"}},
            {"model_type", "llama"},
            {"hidden_size", c.dim},
            {"intermediate_size", c.hidden_dim},
            {"num_hidden_layers", c.n_layers},
            {"num_attention_heads", c.n_heads},
            {"num_key_value_heads", c.n_kv_heads},
            {"head_dim", c.head_size()},
            {"vocab_size", c.vocab_size},
            {"max_position_embeddings", c.seq_len},
            {"rms_norm_eps", decimal(c.norm_eps)},
            {"rope_theta", decimal(c.rope_theta)},
            {"rope_scaling", nullptr},
            {"tie_word_embeddings", c.shared_classifier},
            {"hidden_act", "silu"},
            {"attention_bias", false},
            {"mlp_bias", false},
            {"initializer_range", 0.02},
            {"use_cache", true},
            {"torch_dtype", torch_dtype_name(o.dtype)}};
  if (c.rope_scaling)
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", decimal(c.rope_scaling->factor)},
                         {"low_freq_factor", decimal(c.rope_scaling->low_freq_factor)},
                         {"high_freq_factor", decimal(c.rope_scaling->high_freq_factor)},
                         {"original_max_position_embeddings", c.rope_scaling->original_max_position}};
  if (o.bos_token_id) j["bos_token_id"] = *o.bos_token_id;
  if (!o.eos_token_ids.empty()) j["eos_token_id"] = id_or_list(o.eos_token_ids);
  return j;
}

void write_json(const fs::path& path, const json& j) {
  write_atomically(path.string(), [&](std::ostream& out) { out << j.dump(2) << "\n"; });
}

struct OutTensor {
  std::string hf_name;
  tensor::Shape shape;
  std::vector<std::byte> bytes;  // numel(shape) elements of the export dtype
};

// Every parameter under its Hugging Face name, q/k rows reordered for rotate_half, in `dtype`.
std::vector<OutTensor> hf_tensors(const WeightSource& weights, DType dtype) {
  const LlamaConfig& c = weights.config();
  std::vector<OutTensor> out;
  for (const ParamSpec& p : llama_parameters(c)) {
    const HfModule m = hf_module_of(p.name, c);
    std::span<const float> values = weights.get(p.name);
    if (static_cast<int64_t>(values.size()) != tensor::numel(p.shape))
      throw std::invalid_argument("hf export: parameter '" + p.name + "' has " + std::to_string(values.size()) +
                                  " values, expected " + shape_text(p.shape));
    std::vector<float> reordered;
    if (m.rope_heads > 0) {
      reordered.resize(values.size());
      rope_rows_to_hf(reinterpret_cast<std::byte*>(reordered.data()), reinterpret_cast<const std::byte*>(values.data()),
                      m.rope_heads, c.head_size(), static_cast<size_t>(p.shape[1]) * sizeof(float));
      values = reordered;
    }
    OutTensor t{m.path + ".weight", p.shape, std::vector<std::byte>(values.size() * dtype_bytes(dtype))};
    from_f32(t.bytes.data(), values.data(), dtype, static_cast<int64_t>(values.size()));
    out.push_back(std::move(t));
  }
  return out;
}

// Consecutive runs of tensors of about equal bytes: the first index of each shard.
std::vector<size_t> shard_starts(const std::vector<OutTensor>& tensors, int shards) {
  uint64_t total = 0;
  for (const auto& t : tensors) total += t.bytes.size();
  std::vector<size_t> starts{0};
  uint64_t so_far = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t boundary = total * starts.size() / static_cast<uint64_t>(shards);
    if (i > starts.back() && so_far >= boundary && static_cast<int>(starts.size()) < shards) starts.push_back(i);
    so_far += tensors[i].bytes.size();
  }
  return starts;
}

std::string shard_name(size_t k, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "model-%05zu-of-%05zu.safetensors", k + 1, n);
  return buf;
}

}  // namespace

void write_hf_model(const std::string& dir, const WeightSource& weights, const HfExportOptions& options) {
  const LlamaConfig& c = weights.config();
  c.validate();
  if (c.is_moe()) throw std::invalid_argument(dir + ": Hugging Face Llama directories cannot hold a mixture-of-experts model");
  if (!is_float(options.dtype)) throw std::invalid_argument(dir + ": export dtype must be F32, F16 or BF16");
  if (options.shards < 1) throw std::invalid_argument(dir + ": shards must be >= 1");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir)) throw std::runtime_error(dir + ": cannot create the folder" + (ec ? ": " + ec.message() : ""));
  if (fs::exists(fs::path(dir) / "config.json") || fs::exists(fs::path(dir) / "model.safetensors") ||
      fs::exists(fs::path(dir) / INDEX_FILE))
    throw std::runtime_error(dir + ": already holds a model (config.json or safetensors): choose a new folder");

  const std::vector<OutTensor> tensors = hf_tensors(weights, options.dtype);
  const std::vector<size_t> starts = shard_starts(tensors, options.shards);
  const Metadata metadata{{"format", "pt"}};  // transformers refuses safetensors without it
  json weight_map = json::object();
  uint64_t total = 0;
  for (size_t k = 0; k < starts.size(); ++k) {
    const size_t end = k + 1 < starts.size() ? starts[k + 1] : tensors.size();
    const std::string file = options.shards == 1 ? "model.safetensors" : shard_name(k, starts.size());
    std::vector<NamedTensor> named;
    for (size_t i = starts[k]; i < end; ++i) {
      named.push_back({tensors[i].hf_name, {options.dtype, tensors[i].shape, tensors[i].bytes.data()}});
      weight_map[tensors[i].hf_name] = file;
      total += tensors[i].bytes.size();
    }
    write_stored_safetensors((fs::path(dir) / file).string(), named, metadata);
  }
  if (options.shards > 1) write_json(fs::path(dir) / INDEX_FILE, {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}});
  json generation = {{"_from_model_config", true}};
  if (options.bos_token_id) generation["bos_token_id"] = *options.bos_token_id;
  if (!options.eos_token_ids.empty()) generation["eos_token_id"] = id_or_list(options.eos_token_ids);
  write_json(fs::path(dir) / "generation_config.json", generation);
  write_json(fs::path(dir) / "config.json", hf_config_json(c, options));  // last: a folder without it is no model
}

}  // namespace tpcli::model
