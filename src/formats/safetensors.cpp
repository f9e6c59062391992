#include "formats/safetensors.h"

#include <nlohmann/json.hpp>

#include "files/atomic_file.h"
#include "files/json_file.h"
#include "formats/dtype.h"
#include "formats/hf_config.h"
#include "model/packed_weights.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <stdexcept>
#include <tuple>

namespace tpcli::formats {

using files::parse_json_text;
using files::quoted_value;
using files::write_atomically;
using model::DType;

namespace {

constexpr uint64_t MAX_HEADER_BYTES = 100u << 20;  // the safetensors spec's own limit

std::string format_float(float v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", static_cast<double>(v));
  return buf;
}

}  // namespace

// ---- config <-> metadata ----

void config_to_metadata(const model::LlamaConfig& c, Metadata& m) {
  m["format"] = "tpcli";
  m["model.dim"] = std::to_string(c.dim);
  m["model.hidden_dim"] = std::to_string(c.hidden_dim);
  m["model.n_layers"] = std::to_string(c.n_layers);
  m["model.n_heads"] = std::to_string(c.n_heads);
  m["model.n_kv_heads"] = std::to_string(c.n_kv_heads);
  if (c.head_dim) m["model.head_dim"] = std::to_string(c.head_dim);
  else m.erase("model.head_dim");
  m["model.vocab_size"] = std::to_string(c.vocab_size);
  m["model.seq_len"] = std::to_string(c.seq_len);
  m["model.shared_classifier"] = c.shared_classifier ? "true" : "false";
  m["model.norm_eps"] = format_float(c.norm_eps);
  m["model.rope_theta"] = format_float(c.rope_theta);
  m["model.n_experts"] = std::to_string(c.n_experts);
  m["model.top_k"] = std::to_string(c.top_k);
  m["model.expert_hidden_dim"] = std::to_string(c.expert_hidden_dim);
  m["model.moe_aux_loss"] = format_float(c.moe_aux_loss);
  if (c.capacity_factor) m["model.capacity_factor"] = format_float(*c.capacity_factor);
  else m.erase("model.capacity_factor");
  // Beyond the Llama block (formats/hf_config.h's architectures): written only when set, so a Llama
  // checkpoint's metadata is what it always was.
  auto flag = [&](const char* key, bool on) {
    if (on) m[key] = "true";
    else m.erase(key);
  };
  if (!c.hf_architecture.empty()) m["model.hf_architecture"] = c.hf_architecture;
  else m.erase("model.hf_architecture");
  flag("model.qkv_bias", c.qkv_bias);
  flag("model.qk_norm", c.qk_norm);
  if (c.is_moe() && !c.norm_topk_prob) m["model.norm_topk_prob"] = "false";
  else m.erase("model.norm_topk_prob");
  std::string dense;
  for (int l : c.dense_layers) dense += (dense.empty() ? "" : ",") + std::to_string(l);
  if (!dense.empty()) m["model.dense_layers"] = dense;
  else m.erase("model.dense_layers");
  for (const char* key : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position"})
    m.erase(std::string("model.rope_scaling.") + key);
  if (c.rope_scaling) {
    m["model.rope_scaling.factor"] = format_float(c.rope_scaling->factor);
    m["model.rope_scaling.low_freq_factor"] = format_float(c.rope_scaling->low_freq_factor);
    m["model.rope_scaling.high_freq_factor"] = format_float(c.rope_scaling->high_freq_factor);
    m["model.rope_scaling.original_max_position"] = std::to_string(c.rope_scaling->original_max_position);
  }
  std::string factors;
  for (const float f : c.rope_freq_factors) factors += (factors.empty() ? "" : ",") + format_float(f);
  if (!factors.empty()) m["model.rope_freq_factors"] = factors;
  else m.erase("model.rope_freq_factors");
  if (c.quantization) {
    m["quant.bits"] = std::to_string(c.quantization->bits);
    m["quant.group_size"] = std::to_string(c.quantization->group_size);
    m["quant.mode"] = c.quantization->mode;
  } else {
    m.erase("quant.bits");
    m.erase("quant.group_size");
    m.erase("quant.mode");
  }
}

model::LlamaConfig config_from_metadata(const Metadata& m, const std::string& origin) {
  auto text = [&](const std::string& key) -> const std::string& {
    auto it = m.find(key);
    if (it == m.end()) throw std::runtime_error(origin + ": metadata key '" + key + "' is missing");
    return it->second;
  };
  auto integer = [&](const std::string& key, int& out, bool required) {
    if (!required && !m.count(key)) return;
    const std::string& s = text(key);
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    if (ec != std::errc() || end != s.data() + s.size())
      throw std::runtime_error(origin + ": metadata " + key + " = '" + s + "' is not an integer");
  };
  auto real = [&](const std::string& key, float& out) {
    if (!m.count(key)) return;
    const std::string& s = text(key);
    char* end = nullptr;
    out = std::strtof(s.c_str(), &end);
    if (s.empty() || *end != '\0') throw std::runtime_error(origin + ": metadata " + key + " = '" + s + "' is not a number");
  };
  model::LlamaConfig c;
  integer("model.dim", c.dim, true);
  integer("model.hidden_dim", c.hidden_dim, true);
  integer("model.n_layers", c.n_layers, true);
  integer("model.n_heads", c.n_heads, true);
  integer("model.n_kv_heads", c.n_kv_heads, true);
  integer("model.head_dim", c.head_dim, false);
  integer("model.vocab_size", c.vocab_size, true);
  integer("model.seq_len", c.seq_len, true);
  const std::string& shared = text("model.shared_classifier");
  if (shared != "true" && shared != "false")
    throw std::runtime_error(origin + ": metadata model.shared_classifier = '" + shared + "' is not true/false");
  c.shared_classifier = shared == "true";
  real("model.norm_eps", c.norm_eps);
  real("model.rope_theta", c.rope_theta);
  integer("model.n_experts", c.n_experts, false);
  integer("model.top_k", c.top_k, false);
  integer("model.expert_hidden_dim", c.expert_hidden_dim, false);
  real("model.moe_aux_loss", c.moe_aux_loss);
  if (m.count("model.capacity_factor")) {
    float f = 0;
    real("model.capacity_factor", f);
    c.capacity_factor = f;
  }
  auto boolean = [&](const std::string& key, bool& out) {
    if (!m.count(key)) return;
    const std::string& v = text(key);
    if (v != "true" && v != "false") throw std::runtime_error(origin + ": metadata " + key + " = '" + v + "' is not true/false");
    out = v == "true";
  };
  if (m.count("model.hf_architecture")) {
    c.hf_architecture = text("model.hf_architecture");
    if (std::ranges::find(supported_architectures(), c.hf_architecture) == supported_architectures().end())
      throw std::runtime_error(origin + ": metadata model.hf_architecture = '" + c.hf_architecture + "' is not an architecture tpcli runs");
  }
  boolean("model.qkv_bias", c.qkv_bias);
  boolean("model.qk_norm", c.qk_norm);
  boolean("model.norm_topk_prob", c.norm_topk_prob);
  if (m.count("model.dense_layers")) {
    std::string list = text("model.dense_layers");
    for (size_t start = 0; start <= list.size();) {
      const size_t comma = std::min(list.find(',', start), list.size());
      int l = 0;
      const auto [end, ec] = std::from_chars(list.data() + start, list.data() + comma, l);
      if (ec != std::errc() || end != list.data() + comma)
        throw std::runtime_error(origin + ": metadata model.dense_layers = '" + list + "' is not a list of layer indices");
      c.dense_layers.push_back(l);
      start = comma + 1;
    }
  }
  if (m.count("quant.bits") || m.count("quant.group_size") || m.count("quant.mode")) {
    model::Quantization q;
    integer("quant.bits", q.bits, true);
    integer("quant.group_size", q.group_size, true);
    q.mode = m.count("quant.mode") ? text("quant.mode") : "affine";  // older MLX files: affine
    try {
      check_quantization(q);
    } catch (const std::exception& e) {
      throw std::runtime_error(origin + ": metadata: " + e.what());
    }
    c.quantization = q;
  }
  if (m.count("model.rope_scaling.factor")) {
    nn::RopeScaling& s = c.rope_scaling.emplace();
    real("model.rope_scaling.factor", s.factor);
    real("model.rope_scaling.low_freq_factor", s.low_freq_factor);
    real("model.rope_scaling.high_freq_factor", s.high_freq_factor);
    integer("model.rope_scaling.original_max_position", s.original_max_position, true);
  }
  if (m.count("model.rope_freq_factors")) {
    const std::string& list = text("model.rope_freq_factors");
    for (size_t start = 0; start <= list.size();) {
      const size_t comma = std::min(list.find(',', start), list.size());
      const std::string item = list.substr(start, comma - start);
      char* end = nullptr;
      const float f = std::strtof(item.c_str(), &end);
      if (item.empty() || *end != '\0')
        throw std::runtime_error(origin + ": metadata model.rope_freq_factors = '" + list.substr(0, 120) + "' is not a list of numbers");
      c.rope_freq_factors.push_back(f);
      start = comma + 1;
    }
  }
  try {
    c.validate();
  } catch (const std::exception& e) {
    throw std::runtime_error(origin + ": metadata: " + e.what());
  }
  return c;
}

// ---- writing ----

void write_stored_safetensors(const std::string& path, const std::vector<NamedTensor>& given, const Metadata& metadata) {
  // Wider dtypes first (as the safetensors library orders them): the data holds no gaps, so a
  // tensor whose byte count its successor's element size does not divide (mxfp8's U8 scales of
  // an odd row count) would leave the next one unaligned, which the reader refuses.
  std::vector<NamedTensor> tensors = given;
  std::stable_sort(tensors.begin(), tensors.end(), [](const NamedTensor& a, const NamedTensor& b) {
    return dtype_bytes(a.tensor.dtype) > dtype_bytes(b.tensor.dtype);
  });
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__" || header.contains(name))
      throw std::invalid_argument(path + ": duplicate or reserved tensor name '" + name + "'");
    const uint64_t bytes = static_cast<uint64_t>(tensor::numel(t.shape)) * dtype_bytes(t.dtype);
    header[name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  while ((8 + text.size()) % 8 != 0) text += ' ';  // the data starts 8-byte aligned

  write_atomically(path, [&](std::ostream& out) {
    const uint64_t n = text.size();  // little-endian host (x86-64)
    out.write(reinterpret_cast<const char*>(&n), sizeof(n));
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const auto& [name, t] : tensors)
      out.write(static_cast<const char*>(t.data),
                static_cast<std::streamsize>(tensor::numel(t.shape) * static_cast<int64_t>(dtype_bytes(t.dtype))));
  });
}

void write_safetensors(const std::string& path, const std::vector<TensorView>& tensors, const Metadata& metadata) {
  std::vector<NamedTensor> stored;
  for (const auto& t : tensors) {
    if (static_cast<int64_t>(t.data.size()) != tensor::numel(t.shape))
      throw std::invalid_argument(path + ": tensor " + t.name + " has " + std::to_string(t.data.size()) +
                                  " values for shape " + tensor::to_string(t.shape));
    stored.push_back({t.name, {DType::F32, t.shape, t.data.data()}});
  }
  write_stored_safetensors(path, stored, metadata);
}

void write_safetensors(const std::string& path, const model::WeightSource& weights, Metadata metadata) {
  config_to_metadata(weights.config(), metadata);
  std::vector<TensorView> tensors;
  std::vector<NamedTensor> stored;  // parameters kept as stored: 16-bit, or packed with scales (and biases)
  for (const auto& p : llama_parameters(weights.config())) {
    auto st = weights.stored(p.name);
    if (!st || st->dtype == DType::F32) {
      tensors.push_back({p.name, p.shape, weights.get(p.name)});
      continue;
    }
    stored.push_back({p.name, *st});
    if (st->dtype != DType::U32) continue;
    for (const char* part : {".scales", ".biases"})
      if (auto q = weights.stored(p.name + part)) stored.push_back({p.name + part, *q});
  }
  if (stored.empty()) {
    write_safetensors(path, tensors, metadata);
    return;
  }
  for (const auto& t : tensors) stored.push_back({t.name, {DType::F32, t.shape, t.data.data()}});
  write_stored_safetensors(path, stored, metadata);
}

// ---- reading ----

namespace {

constexpr uint64_t MAX_DIM = uint64_t{1} << 40;  // far beyond any real tensor; keeps products in range

nlohmann::json parse_header(std::string_view text, const std::string& path) {
  // "PATH: header: not valid JSON at byte N: ...", nesting bounded (files/json_file.h)
  return parse_json_text(text, path + ": header");
}

// One header entry {"dtype": .., "shape": [..], "data_offsets": [begin, end]}, checked against
// the data bytes that follow the header.
model::StoredTensor read_entry(const std::string& path, const std::string& name, const nlohmann::json& entry,
                        const std::byte* data, uint64_t data_size) {
  auto bad = [&](const std::string& what) { return std::runtime_error(path + ": tensor " + quoted_value(name) + ": " + what); };
  if (!entry.is_object()) throw bad("entry is not an object");
  auto dtype_it = entry.find("dtype"), shape_it = entry.find("shape"), offsets_it = entry.find("data_offsets");
  if (dtype_it == entry.end() || !dtype_it->is_string()) throw bad("dtype missing");
  const std::optional<DType> dtype = dtype_from_name(dtype_it->get<std::string>());
  if (!dtype) throw bad("dtype " + dtype_it->get<std::string>() + " is not supported (F32, F16, BF16, U32, U8)");
  if (shape_it == entry.end() || !shape_it->is_array()) throw bad("shape missing");
  if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2)
    throw bad("data_offsets must be [begin, end]");
  model::StoredTensor t;
  t.dtype = *dtype;
  uint64_t count = 1;
  for (const auto& d : *shape_it) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > MAX_DIM) throw bad("bad shape entry");
    t.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
    count *= d.get<uint64_t>();
    if (count > MAX_DIM) throw bad("shape too large");
  }
  const auto& offsets = *offsets_it;
  if (!offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned()) throw bad("data_offsets are not integers");
  const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
  if (begin > end || end > data_size)
    throw bad("data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "] outside the " +
              std::to_string(data_size) + " data bytes (truncated file?)");
  const uint64_t element = dtype_bytes(*dtype);
  if (end - begin != count * element)
    throw bad("data_offsets span " + std::to_string(end - begin) + " bytes but shape " + tensor::to_string(t.shape) +
              " of " + dtype_name(*dtype) + " needs " + std::to_string(count * element));
  if (reinterpret_cast<uintptr_t>(data + begin) % element != 0)
    throw bad("data is not " + std::to_string(element) + "-byte aligned");
  t.data = data + begin;
  return t;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : map_(path) {
  if (map_.size() < 8) throw std::runtime_error(path + ": file is " + std::to_string(map_.size()) + " bytes, too short for a safetensors header");
  uint64_t n = 0;
  std::memcpy(&n, map_.data(), 8);
  if (n > MAX_HEADER_BYTES || n > map_.size() - 8)
    throw std::runtime_error(path + ": header length " + std::to_string(n) + " exceeds the file (" +
                             std::to_string(map_.size()) + " bytes): not a safetensors file?");
  const std::string_view header_text(reinterpret_cast<const char*>(map_.data()) + 8, n);
  if (header_text.empty() || header_text[0] != '{') throw std::runtime_error(path + ": header does not start with '{': not a safetensors file?");
  const nlohmann::json header = parse_header(header_text, path);
  if (!header.is_object()) throw std::runtime_error(path + ": header is not a JSON object");

  const std::byte* data = map_.data() + 8 + n;
  const uint64_t data_size = map_.size() - 8 - n;
  for (const auto& [name, entry] : header.items()) {
    if (name != "__metadata__") {
      model::StoredTensor t = read_entry(path, name, entry, data, data_size);
      if (t.dtype == DType::F32)
        tensors_.emplace(name, TensorView{name, t.shape, {static_cast<const float*>(t.data), size_t(tensor::numel(t.shape))}});
      stored_.emplace(name, std::move(t));
      continue;
    }
    if (!entry.is_object()) throw std::runtime_error(path + ": __metadata__ is not an object");
    for (const auto& [k, v] : entry.items()) {
      if (!v.is_string()) throw std::runtime_error(path + ": __metadata__[" + quoted_value(k) + "] is not a string");
      metadata_[k] = v.get<std::string>();
    }
  }

  refuse_overlaps(data);
  if (metadata_.count("model.dim")) {
    config_ = config_from_metadata(metadata_, path);
    for (const auto& p : llama_parameters(*config_)) {
      auto it = stored_.find(p.name);
      if (it == stored_.end()) throw std::runtime_error(path + ": parameter tensor '" + p.name + "' is missing");
      if (it->second.dtype == DType::U32) {
        check_packed_parameter(p);
        continue;
      }
      if (it->second.shape != p.shape)
        throw std::runtime_error(path + ": parameter " + p.name + " has shape " + tensor::to_string(it->second.shape) +
                                 ", the config implies " + tensor::to_string(p.shape));
      if (!is_float(it->second.dtype))
        throw std::runtime_error(path + ": parameter " + p.name + " is " + dtype_name(it->second.dtype) + ", not a float type");
    }
  }
}

// The format forbids two tensors sharing bytes: writing one would change the other. Sorted by
// where they begin, each must begin at or after the end of the one before.
void SafetensorsFile::refuse_overlaps(const std::byte* data) const {
  struct Span {
    uint64_t begin, end;
    const std::string* name;
  };
  std::vector<Span> spans;
  spans.reserve(stored_.size());
  for (const auto& [name, t] : stored_) {
    const auto begin = static_cast<uint64_t>(static_cast<const std::byte*>(t.data) - data);
    spans.push_back({begin, begin + static_cast<uint64_t>(tensor::numel(t.shape)) * dtype_bytes(t.dtype), &name});
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
  for (size_t i = 1; i < spans.size(); ++i) {
    const Span &previous = spans[i - 1], &next = spans[i];
    if (next.begin < previous.end)
      throw std::runtime_error(path() + ": tensors " + quoted_value(*previous.name) + " (data_offsets [" +
                               std::to_string(previous.begin) + ", " + std::to_string(previous.end) + "]) and " +
                               quoted_value(*next.name) + " ([" +
                               std::to_string(next.begin) + ", " + std::to_string(next.end) +
                               "]) overlap: safetensors tensors may not share bytes");
  }
}

// A quantized parameter: packed words plus scales (and biases) in the shapes its config implies.
void SafetensorsFile::check_packed_parameter(const model::ParamSpec& p) const {
  const std::string& path = this->path();
  if (!config_->quantization)
    throw std::runtime_error(path + ": parameter " + p.name + " is U32 (packed) but the metadata has no quant.bits");
  const model::Quantization& q = *config_->quantization;
  for (const auto& [name, shape] : packed_shapes(p, q)) {
    auto part = stored_.find(name);
    if (part == stored_.end()) throw std::runtime_error(path + ": quantized parameter's tensor '" + name + "' is missing");
    if (part->second.shape != shape)
      throw std::runtime_error(path + ": " + name + " has shape " + tensor::to_string(part->second.shape) + ", " + q.mode +
                               " " + std::to_string(q.bits) + "-bit groups of " + std::to_string(q.group_size) +
                               " imply " + tensor::to_string(shape));
  }
}

const TensorView& SafetensorsFile::tensor(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it != tensors_.end()) return it->second;
  auto st = stored_.find(name);
  if (st == stored_.end()) throw std::out_of_range(path() + ": no tensor named '" + name + "'");
  throw std::runtime_error(path() + ": tensor '" + name + "' is " + dtype_name(st->second.dtype) + ", not F32");
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : stored_) out.push_back(k);
  return out;
}

const model::LlamaConfig& SafetensorsFile::config() const {
  if (!config_) throw std::runtime_error(path() + ": no model config in the metadata (model.* keys)");
  return *config_;
}

std::optional<model::StoredTensor> SafetensorsFile::stored(const std::string& name) const {
  auto it = stored_.find(name);
  if (it == stored_.end()) {
    if (name == "output" && config_ && config_->shared_classifier) return stored("tok_embeddings");
    return std::nullopt;
  }
  return it->second;
}

void SafetensorsFile::release_conversions() const {
  std::lock_guard lock(converted_mutex_);
  converted_.clear();
}

void SafetensorsFile::release_pages(const std::string& name) const {
  const std::optional<model::StoredTensor> t = stored(name);
  if (!t) throw std::out_of_range(path() + ": no tensor named '" + name + "'");
  map_.release_pages(t->data, static_cast<size_t>(tensor::numel(t->shape)) * dtype_bytes(t->dtype));
}

std::span<const float> SafetensorsFile::get(const std::string& name) const {
  if (name == "output" && config_ && config_->shared_classifier && !stored_.count("output")) return get("tok_embeddings");
  if (auto it = tensors_.find(name); it != tensors_.end()) return it->second.data;
  auto st = stored_.find(name);
  if (st == stored_.end()) throw std::out_of_range(path() + ": no tensor named '" + name + "'");
  const bool packed = st->second.dtype == DType::U32 && config_ && config_->quantization;
  if (!is_float(st->second.dtype) && !packed)
    throw std::runtime_error(path() + ": tensor '" + name + "' is " + dtype_name(st->second.dtype) + ", not a float type");
  std::lock_guard lock(converted_mutex_);
  auto [slot, fresh] = converted_.try_emplace(name);
  if (fresh && packed) {  // a quantized parameter, dequantized (model/packed_weights.h)
    const tensor::Tensor full = load_packed_full(*this, name).dequantize();
    slot->second.assign(full.span().begin(), full.span().end());
  } else if (fresh) {
    slot->second.resize(static_cast<size_t>(tensor::numel(st->second.shape)));
    to_f32(slot->second.data(), st->second.data, st->second.dtype, tensor::numel(st->second.shape));
  }
  return slot->second;
}

}  // namespace tpcli::formats
