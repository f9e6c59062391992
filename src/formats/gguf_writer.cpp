#include "formats/gguf_writer.h"

#include <cstring>
#include <fstream>
#include <set>
#include <stdexcept>

#include "files/atomic_file.h"
#include "formats/hf_names.h"  // rope_rows_to_hf
#include "model/block_matrices.h"
#include "model/llama_config.h"
#include "tensor/ggml_blocks.h"

namespace tpcli::formats {

namespace gguf {

namespace {

constexpr uint32_t VERSION = 3, ALIGNMENT = 32;

Value scalar(ValueType type, Scalar item) { return Value{type, ValueType::u32, {std::move(item)}}; }

template <typename T>
Value array_of(ValueType element_type, const std::vector<T>& items, auto convert) {
  Value v{ValueType::array, element_type, {}};
  v.items.reserve(items.size());
  for (const T& item : items) v.items.emplace_back(convert(item));
  return v;
}

uint64_t row_bytes(TensorType type, uint64_t row) {
  const tensor::GgmlTypeTraits& t = tensor::ggml_traits(type);
  return row / static_cast<uint64_t>(t.block_elements) * static_cast<uint64_t>(t.block_bytes);
}

uint64_t tensor_bytes(const TensorToWrite& t) {
  uint64_t rows = 1;
  for (size_t i = 1; i < t.ne.size(); ++i) rows *= t.ne[i];
  return rows * row_bytes(t.type, t.ne[0]);
}

uint64_t aligned(uint64_t at) { return (at + ALIGNMENT - 1) / ALIGNMENT * ALIGNMENT; }

// Little-endian output, as GGUF stores every number (tpcli runs on little-endian hosts only).
class Out {
 public:
  explicit Out(std::ostream& out) : out_(out) {}
  template <typename T>
  void number(T v) { bytes(&v, sizeof v); }
  void string(const std::string& s) {
    number<uint64_t>(s.size());
    bytes(s.data(), s.size());
  }
  void bytes(const void* p, size_t n) {
    out_.write(static_cast<const char*>(p), static_cast<std::streamsize>(n));
    at_ += n;
  }
  void pad_to(uint64_t at) {
    static const char zeros[ALIGNMENT] = {};
    bytes(zeros, at - at_);
  }
  uint64_t at() const { return at_; }

 private:
  std::ostream& out_;
  uint64_t at_ = 0;
};

void write_scalar(Out& out, ValueType type, const Scalar& s) {
  switch (type) {
    case ValueType::u8: return out.number(static_cast<uint8_t>(std::get<uint64_t>(s)));
    case ValueType::i8: return out.number(static_cast<int8_t>(std::get<int64_t>(s)));
    case ValueType::u16: return out.number(static_cast<uint16_t>(std::get<uint64_t>(s)));
    case ValueType::i16: return out.number(static_cast<int16_t>(std::get<int64_t>(s)));
    case ValueType::u32: return out.number(static_cast<uint32_t>(std::get<uint64_t>(s)));
    case ValueType::i32: return out.number(static_cast<int32_t>(std::get<int64_t>(s)));
    case ValueType::u64: return out.number(std::get<uint64_t>(s));
    case ValueType::i64: return out.number(std::get<int64_t>(s));
    case ValueType::f32: return out.number(static_cast<float>(std::get<double>(s)));
    case ValueType::f64: return out.number(std::get<double>(s));
    case ValueType::boolean: return out.number(static_cast<uint8_t>(std::get<bool>(s)));
    case ValueType::string: return out.string(std::get<std::string>(s));
    case ValueType::array: break;
  }
  throw std::invalid_argument("gguf: an array cannot hold arrays");
}

void write_value(Out& out, const Value& v) {
  out.number(static_cast<uint32_t>(v.type));
  if (v.type != ValueType::array) return write_scalar(out, v.type, v.items.at(0));
  out.number(static_cast<uint32_t>(v.element_type));
  out.number<uint64_t>(v.items.size());
  for (const Scalar& s : v.items) write_scalar(out, v.element_type, s);
}

// Rows of ne[0] values in `type`, one row at a time.
void write_data(Out& out, const TensorToWrite& t) {
  const std::vector<float> values = t.values();
  const uint64_t row = t.ne[0], rows = tensor_bytes(t) / row_bytes(t.type, row);
  if (values.size() != row * rows)
    throw std::logic_error("gguf: tensor '" + t.name + "' gave " + std::to_string(values.size()) + " values for " +
                           std::to_string(row * rows));
  std::vector<std::byte> buffer(row_bytes(t.type, row));
  for (uint64_t r = 0; r < rows; ++r) {
    tensor::quantize_row(t.type, values.data() + r * row, buffer.data(), static_cast<int64_t>(row));
    out.bytes(buffer.data(), buffer.size());
  }
}

}  // namespace

Value string_value(std::string text) { return scalar(ValueType::string, std::move(text)); }
Value u32_value(uint32_t v) { return scalar(ValueType::u32, uint64_t{v}); }
Value f32_value(float v) { return scalar(ValueType::f32, double{v}); }
Value bool_value(bool v) { return scalar(ValueType::boolean, v); }
Value strings_value(const std::vector<std::string>& items) {
  return array_of(ValueType::string, items, [](const std::string& s) { return Scalar{s}; });
}
Value f32s_value(const std::vector<float>& items) {
  return array_of(ValueType::f32, items, [](float f) { return Scalar{double{f}}; });
}
Value i32s_value(const std::vector<int32_t>& items) {
  return array_of(ValueType::i32, items, [](int32_t i) { return Scalar{int64_t{i}}; });
}

GgufWriter::GgufWriter() { add(gguf_keys::ALIGNMENT, u32_value(ALIGNMENT)); }

void GgufWriter::add(const std::string& key, Value value) {
  for (const auto& [k, v] : metadata_)
    if (k == key) throw std::invalid_argument("gguf: metadata '" + key + "' added twice");
  metadata_.emplace_back(key, std::move(value));
}

void GgufWriter::add_tensor(TensorToWrite tensor) {
  for (const TensorToWrite& t : tensors_)
    if (t.name == tensor.name) throw std::invalid_argument("gguf: tensor '" + tensor.name + "' added twice");
  const tensor::GgmlTypeTraits& traits = tensor::ggml_traits(tensor.type);
  if (!tensor::quantizable(tensor.type)) throw std::invalid_argument("gguf: tensor '" + tensor.name + "': type " + traits.name + " is not written");
  if (tensor.ne.empty() || tensor.ne.size() > 4 || tensor.ne[0] % static_cast<uint64_t>(traits.block_elements) != 0)
    throw std::invalid_argument("gguf: tensor '" + tensor.name + "': rows of " + std::to_string(tensor.ne.empty() ? 0 : tensor.ne[0]) +
                                " values are no whole number of " + traits.name + " blocks");
  tensors_.push_back(std::move(tensor));
}

void GgufWriter::write(std::ostream& stream) const {
  Out out(stream);
  out.bytes("GGUF", 4);
  out.number(VERSION);
  out.number<uint64_t>(tensors_.size());
  out.number<uint64_t>(metadata_.size());
  for (const auto& [key, value] : metadata_) {
    out.string(key);
    write_value(out, value);
  }
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors_) {
    out.string(t.name);
    out.number(static_cast<uint32_t>(t.ne.size()));
    for (uint64_t n : t.ne) out.number(n);
    out.number(static_cast<uint32_t>(t.type));
    out.number(offset);
    offset = aligned(offset + tensor_bytes(t));
  }
  const uint64_t data_start = aligned(out.at());
  out.pad_to(data_start);
  for (const TensorToWrite& t : tensors_) {
    write_data(out, t);
    out.pad_to(data_start + aligned(out.at() - data_start));
  }
}

}  // namespace gguf

namespace {

using gguf::TensorToWrite;
using tensor::GgmlType;

// ggml's llama_ftype of a file whose matrices are of `type` (general.file_type).
uint32_t file_type_of(GgmlType type) {
  switch (type) {
    case GgmlType::F32: return 0;
    case GgmlType::F16: return 1;
    case GgmlType::Q8_0: return 7;
    case GgmlType::BF16: return 32;
    default: throw std::invalid_argument(std::string("gguf: matrices of type ") + tensor::ggml_traits(type).name + " are not written");
  }
}

std::vector<uint64_t> ggml_shape(const tensor::Shape& shape) { return {shape.rbegin(), shape.rend()}; }

// Parameter `name`'s values in llama.cpp's row order (rotate-half q/k rows for qwen2 and phi3).
std::vector<float> gguf_values(const model::WeightSource& weights, const std::string& architecture, const std::string& name) {
  const std::span<const float> v = weights.get(name);
  const auto parsed = model::parse_tensor_name(name);
  const int heads = parsed && architecture != "llama" ? model::rope_heads(parsed->key.matrix, weights.config()) : 0;
  if (heads == 0) return {v.begin(), v.end()};
  std::vector<float> out(v.size());
  const int head_size = weights.config().head_size();
  const size_t row_bytes = v.size() / static_cast<size_t>(heads * head_size) * sizeof(float);
  rope_rows_to_hf(reinterpret_cast<std::byte*>(out.data()), reinterpret_cast<const std::byte*>(v.data()), heads, head_size, row_bytes);
  return out;
}

// Adds the tensors of a model, each made of one or more parameters (Phi-3's fused parts) in order.
class ModelTensors {
 public:
  ModelTensors(const model::WeightSource& weights, const std::string& architecture, GgmlType type, std::vector<std::string>* fallbacks)
      : weights_(weights), architecture_(architecture), type_(type), fallbacks_(fallbacks) {}

  // Matrices in the export's type; vectors and the MoE router F32 (llama.cpp's converter keeps
  // them so); Q8_0 rows that are no whole number of blocks F16 (its fallback too).
  void add(gguf::GgufWriter& w, const std::string& gguf_name, std::vector<std::string> parts, std::vector<uint64_t> ne, bool router) {
    GgmlType type = ne.size() == 1 || router ? GgmlType::F32 : type_;
    if (type == GgmlType::Q8_0 && ne[0] % static_cast<uint64_t>(tensor::ggml_traits(type).block_elements) != 0) {
      type = GgmlType::F16;
      if (fallbacks_) fallbacks_->push_back(gguf_name);
    }
    const model::WeightSource& weights = weights_;
    w.add_tensor({gguf_name, std::move(ne), type, [&weights, arch = architecture_, parts = std::move(parts)] {
                    std::vector<float> all;
                    for (const std::string& p : parts) {
                      const std::vector<float> v = gguf_values(weights, arch, p);
                      all.insert(all.end(), v.begin(), v.end());
                    }
                    return all;
                  }});
  }

 private:
  const model::WeightSource& weights_;
  std::string architecture_;
  GgmlType type_;
  std::vector<std::string>* fallbacks_;
};

void add_hyperparameters(gguf::GgufWriter& w, const model::LlamaConfig& c, const std::string& arch) {
  using namespace gguf_keys;
  const auto key = [&](const char* k) { return arch_key(arch, k); };
  w.add(key(CONTEXT_LENGTH), gguf::u32_value(c.seq_len));
  w.add(key(EMBEDDING_LENGTH), gguf::u32_value(c.dim));
  w.add(key(BLOCK_COUNT), gguf::u32_value(c.n_layers));
  w.add(key(FEED_FORWARD_LENGTH), gguf::u32_value(c.is_moe() && c.expert_hidden_dim ? c.expert_hidden_dim : c.hidden_dim));
  w.add(key(HEAD_COUNT), gguf::u32_value(c.n_heads));
  w.add(key(HEAD_COUNT_KV), gguf::u32_value(c.n_kv_heads));
  if (c.head_size() != c.dim / c.n_heads) {  // llama.cpp assumes dim / heads otherwise
    w.add(key(KEY_LENGTH), gguf::u32_value(c.head_size()));
    w.add(key(VALUE_LENGTH), gguf::u32_value(c.head_size()));
  }
  w.add(key(RMS_EPSILON), gguf::f32_value(c.norm_eps));
  w.add(key(ROPE_DIMENSION_COUNT), gguf::u32_value(c.head_size()));
  w.add(key(ROPE_FREQ_BASE), gguf::f32_value(c.rope_theta));
  if (c.is_moe()) {
    w.add(key(EXPERT_COUNT), gguf::u32_value(c.n_experts));
    w.add(key(EXPERT_USED_COUNT), gguf::u32_value(c.top_k));
  }
  // Phi-3's llama.cpp asks for a window; tpcli's context is the window its reader keeps.
  if (arch == "phi3") w.add(key(SLIDING_WINDOW), gguf::u32_value(c.seq_len));
  w.add(key(VOCAB_SIZE), gguf::u32_value(c.vocab_size));
}

void add_vocabulary(gguf::GgufWriter& w, const GgufVocabulary& v, int vocab_size) {
  using namespace gguf_keys;
  const size_t n = v.tokens.size();
  if (n != static_cast<size_t>(vocab_size))
    throw std::invalid_argument("the tokenizer has " + std::to_string(n) + " tokens, the model's embedding " + std::to_string(vocab_size) +
                                " rows: llama.cpp needs them equal");
  if (v.token_types.size() != n || (!v.scores.empty() && v.scores.size() != n))
    throw std::logic_error("gguf vocabulary: tokens, scores and token types differ in count");
  w.add(TOKENIZER_MODEL, gguf::string_value(v.model));
  if (v.pre) w.add(TOKENIZER_PRE, gguf::string_value(*v.pre));
  w.add(TOKENS, gguf::strings_value(v.tokens));
  if (!v.scores.empty()) w.add(SCORES, gguf::f32s_value(v.scores));
  w.add(TOKEN_TYPE, gguf::i32s_value(v.token_types));
  if (!v.merges.empty()) w.add(MERGES, gguf::strings_value(v.merges));
  const auto id = [&](const char* key, const std::optional<uint32_t>& value) {
    if (!value) return;
    if (*value >= n) throw std::invalid_argument(std::string(key) + " " + std::to_string(*value) + " is no token of the " + std::to_string(n));
    w.add(key, gguf::u32_value(*value));
  };
  id(BOS_ID, v.bos_id);
  id(EOS_ID, v.eos_id);
  id(UNKNOWN_ID, v.unknown_id);
  id(PADDING_ID, v.padding_id);
  if (v.add_bos) w.add(ADD_BOS, gguf::bool_value(*v.add_bos));
  if (v.add_eos) w.add(ADD_EOS, gguf::bool_value(*v.add_eos));
  if (v.chat_template) w.add(CHAT_TEMPLATE, gguf::string_value(*v.chat_template));
}

}  // namespace

std::string gguf_architecture_of(const model::LlamaConfig& c) {
  const std::string& hf = c.hf_architecture;
  const auto refuse = [&](const std::string& what) {
    return std::invalid_argument("cannot be written as GGUF: " + what + " (tpcli writes llama, Mixtral-style llama, qwen2 and phi3)");
  };
  if (c.quantization) throw refuse("the model is quantized in tpcli's own format; dequantize it (export --to hf --dtype f32) first");
  if (hf == "Qwen2ForCausalLM") {
    model::LlamaConfig without_bias = c;
    without_bias.qkv_bias = false;
    if (!c.qkv_bias || !without_bias.beyond_llama_feature().empty() || c.is_moe()) throw refuse("a Qwen2 model with other features");
    return "qwen2";
  }
  if (!c.beyond_llama_feature().empty()) throw refuse(c.beyond_llama_feature());
  if (hf == "Phi3ForCausalLM") {
    if (c.is_moe() || c.q_dim() != c.dim) throw refuse("a Phi-3 model whose heads do not span dim, or with experts");
    return "phi3";
  }
  if (hf.empty() || hf == "LlamaForCausalLM" || hf == "MistralForCausalLM" || (hf == "MixtralForCausalLM" && c.is_moe())) return "llama";
  throw refuse("architecture " + hf);
}

gguf::GgufWriter gguf_model_writer(const model::WeightSource& weights, const GgufExportOptions& options,
                                   std::vector<std::string>* fallbacks) {
  const model::LlamaConfig& c = weights.config();
  const std::string arch = gguf_architecture_of(c);
  gguf::GgufWriter w;
  w.add(gguf_keys::ARCHITECTURE, gguf::string_value(arch));
  w.add(gguf_keys::NAME, gguf::string_value(options.name));
  add_hyperparameters(w, c, arch);
  w.add(gguf_keys::FILE_TYPE, gguf::u32_value(file_type_of(options.type)));
  w.add(gguf_keys::QUANTIZATION_VERSION, gguf::u32_value(2));
  if (options.vocabulary) add_vocabulary(w, *options.vocabulary, c.vocab_size);

  ModelTensors tensors(weights, arch, options.type, fallbacks);
  // Llama 3's scaling as llama.cpp's converter writes it: a divisor per pair, before the model's tensors.
  std::vector<float> factors = c.rope_freq_factors;
  if (c.rope_scaling) factors = nn::llama3_frequency_factors(c.head_size(), c.rope_theta, *c.rope_scaling);
  if (!factors.empty())
    w.add_tensor({gguf_keys::ROPE_FREQS_TENSOR, {factors.size()}, GgmlType::F32, [factors] { return factors; }});
  const auto shape_of = [&](const std::string& name) {
    for (const model::ParamSpec& p : model::llama_parameters(c))
      if (p.name == name) return ggml_shape(p.shape);
    throw std::logic_error("gguf: no parameter " + name);
  };
  tensors.add(w, "token_embd.weight", {"tok_embeddings"}, shape_of("tok_embeddings"), false);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string block = "blk." + std::to_string(l) + ".";
    std::set<model::Matrix> fused_done;
    for (const model::MatrixFacts& f : model::block_matrices()) {
      if (!model::holds(c, l, f.matrix)) continue;
      const std::string name = model::tensor_name({l, f.matrix});
      if (arch != "phi3" || !f.fused_hf_module) {
        tensors.add(w, block + f.gguf, {name}, shape_of(name), f.matrix == model::Matrix::Router);
        continue;
      }
      // Phi-3: the parts in order as one tensor (attn_qkv, or ffn_up holding gate then up).
      const std::vector<model::Matrix> parts = model::linear_parts(f.matrix);
      if (fused_done.contains(parts[0])) continue;
      fused_done.insert(parts[0]);
      std::vector<std::string> names;
      std::vector<uint64_t> ne = shape_of(name);
      ne[1] = 0;
      for (model::Matrix part : parts) {
        names.push_back(model::tensor_name({l, part}));
        ne[1] += static_cast<uint64_t>(model::block_shape(part, c)[0]);
      }
      const bool attention = parts[0] == model::Matrix::Wq;
      tensors.add(w, block + (attention ? "attn_qkv.weight" : "ffn_up.weight"), names, ne, false);
    }
  }
  tensors.add(w, "output_norm.weight", {"norm"}, shape_of("norm"), false);
  if (!c.shared_classifier) tensors.add(w, "output.weight", {"output"}, shape_of("output"), false);
  else if (arch == "phi3") tensors.add(w, "output.weight", {"tok_embeddings"}, shape_of("tok_embeddings"), false);
  return w;
}

std::vector<std::string> write_gguf_model(const std::string& path, const model::WeightSource& weights, const GgufExportOptions& options) {
  std::vector<std::string> fallbacks;
  const gguf::GgufWriter writer = gguf_model_writer(weights, options, &fallbacks);
  files::write_atomically(path, [&](std::ostream& out) { writer.write(out); });
  return fallbacks;
}

}  // namespace tpcli::formats
