#include "formats/hf_model.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>
#include <stdexcept>

#include "files/atomic_file.h"
#include "files/json_file.h"
#include "formats/dtype.h"
#include "formats/hf_architectures.h"
#include "model/packed_weights.h"

namespace tpcli::formats {

using files::quoted_value;
using files::read_json_file;
using files::write_atomically;
using model::DType;

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const char* const INDEX_FILE = "model.safetensors.index.json";

std::string shape_text(const tensor::Shape& s) { return tensor::to_string(s); }

// MLX quantizes every matrix whose input dimension its group divides and leaves the rest (and the
// norms) in float: a matrix it would have quantized but that is stored in float contradicts a
// config.json that states a quantization, and would run unquantized while `inspect` said otherwise.
bool mlx_would_quantize(const model::ParamSpec& p, const model::Quantization& q) {
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

const HfModelDir::Source& HfModelDir::add_source(const std::string& name, const HfTensorRef& ref, const std::string& suffix) {
  Source s{{}, ref, "", false};
  auto tensor_name = [&](const std::string& module) { return module + (suffix.empty() ? "." + ref.kind : suffix); };
  if (!ref.stacked_module.empty() && !file_of_.count(tensor_name(ref.modules.front())) &&
      file_of_.count(tensor_name(ref.stacked_module))) {
    s.ref.modules = {ref.stacked_module};
    s.stacked = true;
  }
  for (const std::string& module : s.ref.modules) {
    const std::string hf_name = tensor_name(module);
    auto it = file_of_.find(hf_name);
    if (it == file_of_.end()) {
      const std::string where = files_.size() == 1 ? files_.front()->path() : (fs::path(dir_) / INDEX_FILE).string();
      throw std::runtime_error(where + ": tensor '" + hf_name + "' is missing");
    }
    s.parts.push_back({it->second, hf_name});
    s.key += hf_name + (ref.rows ? "@" + std::to_string(ref.row_offset) : "") + ";";
  }
  return sources_[name + suffix] = std::move(s);
}

namespace {

// The rows every part of a source must have: a fused tensor's, else the parameter's own (one
// expert's for stacked experts).
tensor::Shape part_shape(const model::ParamSpec& p, const HfTensorRef& ref) {
  tensor::Shape shape = p.shape;
  if (ref.modules.size() > 1) shape.erase(shape.begin());  // one expert's (stacked: ref.modules is the stack)
  if (ref.fused_rows) shape[0] = ref.fused_rows;
  return shape;
}

}  // namespace

void HfModelDir::check_float_source(const model::ParamSpec& p, const Source& s) const {
  const model::LlamaConfig& c = hf_.llama;
  const tensor::Shape want = part_shape(p, s.ref);
  for (const Part& part : s.parts) {
    const model::StoredTensor t = *part.file->stored(part.hf_name);
    auto bad = [&](const std::string& what) { return std::runtime_error(part.file->path() + ": tensor '" + part.hf_name + "' " + what); };
    if (!is_float(t.dtype)) throw bad(std::string("is ") + dtype_name(t.dtype) + " (no .scales beside it): not a float weight");
    const bool router = p.block && p.block->matrix == model::Matrix::Router;  // routers vary by recipe
    if (c.quantization && mlx_would_quantize(p, *c.quantization) && !router)
      throw bad(std::string("is ") + dtype_name(t.dtype) + " with no .scales beside it, but config.json's quantization (" +
                c.quantization->mode + ", " + std::to_string(c.quantization->bits) + " bits, group_size " +
                std::to_string(c.quantization->group_size) + ") says it is quantized: the weights do not match config.json");
    if (t.shape != want)
      throw bad("has shape " + shape_text(t.shape) + ", config.json implies " + shape_text(want) +
                (s.ref.fused_rows ? " (the fused segments together)" : ""));
  }
}

void HfModelDir::check_quantized_source(const model::ParamSpec& p, const Source& s, const HfTensorRef& ref, const model::Quantization& q) {
  const tensor::Shape want = part_shape(p, s.ref);  // [rows, cols], or [E, rows, cols] stacked
  const int64_t cols = want.back();
  auto with_last = [&](int64_t last) {
    tensor::Shape shape = want;
    shape.back() = last;
    return shape;
  };
  for (const Part& part : s.parts) {
    const model::StoredTensor t = *part.file->stored(part.hf_name);
    if (t.dtype != DType::U32 || t.shape != with_last(cols * q.bits / 32))
      throw std::runtime_error(part.file->path() + ": tensor '" + part.hf_name + "' is " + dtype_name(t.dtype) + " " +
                               shape_text(t.shape) + ", a " + std::to_string(q.bits) + "-bit quantized " + shape_text(want) +
                               " needs U32 " + shape_text(with_last(cols * q.bits / 32)));
  }
  for (const char* suffix : {".scales", ".biases"}) {
    if (q.mode != "affine" && std::string(suffix) == ".biases") continue;
    for (const Part& part : add_source(p.name, ref, suffix).parts) {
      const model::StoredTensor pt = *part.file->stored(part.hf_name);
      if (pt.shape != with_last(cols / q.group_size))
        throw std::runtime_error(part.file->path() + ": tensor '" + part.hf_name + "' has shape " + shape_text(pt.shape) +
                                 ", group_size " + std::to_string(q.group_size) + " needs " +
                                 shape_text(with_last(cols / q.group_size)));
      if (q.mode == "affine" ? !is_float(pt.dtype) : pt.dtype != DType::U8)
        throw std::runtime_error(part.file->path() + ": tensor '" + part.hf_name + "' has dtype " + dtype_name(pt.dtype));
    }
  }
}

// Every parameter's source, with its dtype and shape checked (quantized: words, scales, biases).
void HfModelDir::map_parameters() {
  const model::LlamaConfig& c = hf_.llama;
  for (const model::ParamSpec& p : llama_parameters(c)) {
    const HfTensorRef ref = hf_tensor_of(p.name, c, hf_.architecture);
    const Source& s = add_source(p.name, ref, "");
    const std::string first_module = s.ref.modules.front();
    const std::optional<model::Quantization> q = quantization_of(p.name);
    if (q && ref.kind == "weight" && file_of_.count(first_module + ".scales")) check_quantized_source(p, s, ref, *q);
    else check_float_source(p, s);
  }
  if (c.shared_classifier)  // the classifier is the embedding: the same source under both names
    for (const char* part : {"", ".scales", ".biases"})
      if (sources_.count(std::string("tok_embeddings") + part))
        sources_[std::string("output") + part] = sources_.at(std::string("tok_embeddings") + part);
}

std::optional<model::Quantization> HfModelDir::quantization_of(const std::string& name) const {
  const auto it = sources_.find(name);
  if (it == sources_.end()) return hf_.llama.quantization;
  const auto router = hf_.router_quantization.find(it->second.ref.modules.front());
  return router == hf_.router_quantization.end() ? hf_.llama.quantization : router->second;
}

const HfModelDir::Source& HfModelDir::source(const std::string& name) const {
  auto it = sources_.find(name);
  if (it == sources_.end()) throw std::out_of_range(dir_ + ": no parameter named '" + name + "'");
  return it->second;
}

namespace {

// Rows [offset, offset + rows) of a stored tensor, as a view.
model::StoredTensor row_range(model::StoredTensor t, int64_t offset, int64_t rows) {
  const size_t row_bytes = static_cast<size_t>(tensor::numel(t.shape) / t.shape[0]) * dtype_bytes(t.dtype);
  t.data = static_cast<const std::byte*>(t.data) + static_cast<size_t>(offset) * row_bytes;
  t.shape[0] = rows;
  return t;
}

}  // namespace

// The parts one after another (each its row range), q/k rows reordered: a copy kept until
// release_conversions.
model::StoredTensor HfModelDir::assembled(const Source& s) const {
  model::StoredTensor first = *s.parts.front().file->stored(s.parts.front().hf_name);
  if (s.ref.rows) first = row_range(first, s.ref.row_offset, s.ref.rows);
  model::StoredTensor out = first;
  out.shape[0] *= static_cast<int64_t>(s.parts.size());
  std::lock_guard lock(assembled_mutex_);
  auto [slot, fresh] = assembled_.try_emplace(s.key);
  if (fresh) {
    const size_t part_bytes = static_cast<size_t>(tensor::numel(first.shape)) * dtype_bytes(first.dtype);
    std::vector<std::byte> stacked(part_bytes * s.parts.size());
    for (size_t i = 0; i < s.parts.size(); ++i) {
      model::StoredTensor t = *s.parts[i].file->stored(s.parts[i].hf_name);
      if (s.ref.rows) t = row_range(t, s.ref.row_offset, s.ref.rows);
      std::memcpy(stacked.data() + i * part_bytes, t.data, part_bytes);
    }
    slot->second.resize(stacked.size());
    if (s.ref.rope_heads == 0) slot->second = std::move(stacked);
    else
      rope_rows_from_hf(slot->second.data(), stacked.data(), s.ref.rope_heads, hf_.llama.head_size(),
                        stacked.size() / static_cast<size_t>(out.shape[0]));
  }
  out.data = slot->second.data();
  return out;
}

std::optional<model::StoredTensor> HfModelDir::stored(const std::string& name) const {
  auto it = sources_.find(name);
  if (it == sources_.end()) return std::nullopt;
  const Source& s = it->second;
  if (!s.view()) return assembled(s);
  const model::StoredTensor t = *s.parts.front().file->stored(s.parts.front().hf_name);
  return s.ref.rows ? row_range(t, s.ref.row_offset, s.ref.rows) : t;
}

namespace {

std::vector<float> to_f32_vector(const model::StoredTensor& t) {
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
  const model::StoredTensor raw = *stored(name);
  // F32: a view into the map, or into the assembled copy (reordered q/k rows, stacked experts),
  // which lives as long as a conversion would: no second f32 copy of it.
  if (raw.dtype == DType::F32) return {static_cast<const float*>(raw.data), static_cast<size_t>(tensor::numel(raw.shape))};
  // One conversion per source, whichever device asks first; the others wait and share it.
  std::lock_guard lock(converted_mutex_);
  auto [slot, fresh] = converted_.try_emplace(s.key);
  if (fresh) slot->second = is_float(raw.dtype) ? to_f32_vector(raw) : dequantized(name);
  return slot->second;
}

void HfModelDir::release_conversions() const {
  std::scoped_lock lock(converted_mutex_, assembled_mutex_);
  converted_.clear();
  assembled_.clear();
}

// Every file tensor the parameter is read from, whole (a fused tensor's other segments are read
// again from the file by whoever still needs them).
void HfModelDir::release_pages(const std::string& name) const {
  for (const Part& part : source(name).parts) part.file->release_pages(part.hf_name);
}

void HfModelDir::release_all_pages() const {
  for (const auto& file : files_) file->release_all_pages();
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

// config.json keys of the architectures beyond Llama's.
void add_architecture_keys(json& j, const model::LlamaConfig& c, const HfArchitecture& a) {
  j["architectures"] = {a.name};
  j["model_type"] = a.model_type;
  if (a.sliding_window_switch) j["use_sliding_window"] = false;
  if (!a.is_moe()) return;
  j[a.experts_key] = c.n_experts;
  j["num_experts_per_tok"] = c.top_k;
  if (a.expert_hidden_key[0]) j[a.expert_hidden_key] = c.expert_hidden_dim ? c.expert_hidden_dim : c.hidden_dim;
  if (a.norm_topk_prob_key) j["norm_topk_prob"] = c.norm_topk_prob;
  if (a.dense_layer_keys) {
    j["decoder_sparse_step"] = 1;
    j["mlp_only_layers"] = c.dense_layers;
  }
}

json hf_config_json(const model::LlamaConfig& c, const std::string& architecture, const HfExportOptions& o) {
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
  add_architecture_keys(j, c, hf_architecture(architecture));
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

// A parameter's f32 values as Hugging Face stores them: q/k rows (and their biases and norms)
// reordered for rotate_half.
std::vector<float> hf_order_values(const model::WeightSource& weights, const model::ParamSpec& p, const HfTensorRef& ref) {
  const std::span<const float> values = weights.get(p.name);
  if (static_cast<int64_t>(values.size()) != tensor::numel(p.shape))
    throw std::invalid_argument("hf export: parameter '" + p.name + "' has " + std::to_string(values.size()) +
                                " values, expected " + shape_text(p.shape));
  if (ref.rope_heads == 0) return {values.begin(), values.end()};
  std::vector<float> reordered(values.size());
  rope_rows_to_hf(reinterpret_cast<std::byte*>(reordered.data()), reinterpret_cast<const std::byte*>(values.data()),
                  ref.rope_heads, weights.config().head_size(), values.size() / static_cast<size_t>(p.shape[0]) * sizeof(float));
  return reordered;
}

// Every parameter under its Hugging Face name in `dtype`: fused segments written into their
// tensor's rows, stacked experts one tensor each.
std::vector<OutTensor> hf_tensors(const model::WeightSource& weights, const std::string& architecture, DType dtype) {
  const model::LlamaConfig& c = weights.config();
  std::vector<std::pair<std::string, tensor::Shape>> order;  // tensors in first-written order
  std::map<std::string, std::vector<float>> values;          // by Hugging Face name
  for (const model::ParamSpec& p : llama_parameters(c)) {
    const HfTensorRef ref = hf_tensor_of(p.name, c, architecture);
    const std::vector<float> v = hf_order_values(weights, p, ref);
    const size_t parts = ref.modules.size(), part_size = v.size() / parts;
    for (size_t i = 0; i < parts; ++i) {
      const std::string name = ref.modules[i] + "." + ref.kind;
      tensor::Shape shape = p.shape;
      if (parts > 1) shape.erase(shape.begin());
      if (ref.fused_rows) shape[0] = ref.fused_rows;
      auto [slot, fresh] = values.try_emplace(name, static_cast<size_t>(tensor::numel(shape)), 0.0f);
      if (fresh) order.emplace_back(name, shape);
      const size_t row = static_cast<size_t>(tensor::numel(shape) / shape[0]);
      std::copy(v.begin() + static_cast<std::ptrdiff_t>(i * part_size), v.begin() + static_cast<std::ptrdiff_t>((i + 1) * part_size),
                slot->second.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(ref.row_offset) * row));
    }
  }
  std::vector<OutTensor> out;
  for (const auto& [name, shape] : order) {
    const std::vector<float>& v = values.at(name);
    OutTensor t{name, shape, std::vector<std::byte>(v.size() * dtype_bytes(dtype))};
    from_f32(t.bytes.data(), v.data(), dtype, static_cast<int64_t>(v.size()));
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

void write_hf_model(const std::string& dir, const model::WeightSource& weights, const HfExportOptions& options) {
  const model::LlamaConfig& c = weights.config();
  c.validate();
  const std::string architecture = c.hf_architecture.empty() ? "LlamaForCausalLM" : c.hf_architecture;
  if (c.is_moe() && !hf_architecture(architecture).is_moe())
    throw std::invalid_argument(dir + ": Hugging Face " + architecture + " directories cannot hold a mixture-of-experts model");
  if (const std::string feature = c.beyond_llama_feature(); !feature.empty() && architecture == "LlamaForCausalLM")
    throw std::invalid_argument(dir + ": Hugging Face Llama directories cannot hold a model with " + feature);
  if (!c.rope_freq_factors.empty())  // config.json holds the llama3 formula's four numbers, not a factor per pair
    throw std::invalid_argument(dir + ": Hugging Face directories cannot hold RoPE frequency factors (a GGUF's rope_freqs.weight)");
  if (!is_float(options.dtype)) throw std::invalid_argument(dir + ": export dtype must be F32, F16 or BF16");
  if (options.shards < 1) throw std::invalid_argument(dir + ": shards must be >= 1");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir)) throw std::runtime_error(dir + ": cannot create the folder" + (ec ? ": " + ec.message() : ""));
  if (fs::exists(fs::path(dir) / "config.json") || fs::exists(fs::path(dir) / "model.safetensors") ||
      fs::exists(fs::path(dir) / INDEX_FILE))
    throw std::runtime_error(dir + ": already holds a model (config.json or safetensors): choose a new folder");

  const std::vector<OutTensor> tensors = hf_tensors(weights, architecture, options.dtype);
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
  write_json(fs::path(dir) / "config.json", hf_config_json(c, architecture, options));  // last: a folder without it is no model
}

}  // namespace tpcli::formats
