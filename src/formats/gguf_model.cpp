#include "formats/gguf_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "formats/gguf_keys.h"
#include "formats/hf_names.h"  // rope_rows_from_hf
#include "formats/llama2c.h"  // MappedFile
#include "model/block_matrices.h"
#include "tensor/ggml_blocks.h"

namespace tpcli::formats {

namespace {

std::string shape_text(const tensor::Shape& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

}  // namespace

bool looks_like_gguf(const std::string& path) {
  std::error_code ignored;
  if (!std::filesystem::is_regular_file(path, ignored)) return false;  // a FIFO would block the read
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::memcmp(magic, "GGUF", 4) == 0;
}

GgufModel::GgufModel(const std::string& path) : file_(path) {
  if (file_.string("general.type") == "adapter")  // convert_lora_to_gguf.py's: no block_count, no embedding
    throw std::runtime_error(path + ": general.type is 'adapter': a LoRA adapter, not a model (pass it as --adapter beside its base model)");
  const auto architecture = file_.string(gguf_keys::ARCHITECTURE);
  if (!architecture) throw std::runtime_error(path + ": metadata 'general.architecture' is missing");
  architecture_ = *architecture;
  if (architecture_ != "llama" && architecture_ != "qwen2" && architecture_ != "phi3")
    throw std::runtime_error(path + ": general.architecture '" + gguf::printable(architecture_) + "' is not supported (supported: llama, qwen2, phi3)");
  config_ = read_config();
  for (const model::ParamSpec& p : model::llama_parameters(config_)) slices_[p.name] = slice_of(p.name);
  check_tensors();
}

model::LlamaConfig GgufModel::read_config() const {
  const std::string prefix = architecture_ + ".";
  const auto required = [&](const char* key) -> int64_t {
    const auto v = file_.integer(prefix + key);
    if (!v) throw std::runtime_error(file_.path() + ": metadata '" + prefix + key + "' is missing");
    if (*v < 1 || *v > (int64_t{1} << 30)) throw std::runtime_error(file_.path() + ": metadata '" + prefix + key + "' is " + std::to_string(*v));
    return *v;
  };
  model::LlamaConfig c;
  c.dim = static_cast<int>(required(gguf_keys::EMBEDDING_LENGTH));
  c.hidden_dim = static_cast<int>(required(gguf_keys::FEED_FORWARD_LENGTH));
  c.n_layers = static_cast<int>(required(gguf_keys::BLOCK_COUNT));
  c.n_heads = static_cast<int>(required(gguf_keys::HEAD_COUNT));
  c.n_kv_heads = static_cast<int>(file_.integer(prefix + gguf_keys::HEAD_COUNT_KV).value_or(c.n_heads));
  c.seq_len = static_cast<int>(required(gguf_keys::CONTEXT_LENGTH));
  if (const auto key_length = file_.integer(prefix + gguf_keys::KEY_LENGTH); key_length && *key_length != c.dim / c.n_heads)
    c.head_dim = static_cast<int>(*key_length);
  if (const auto rope_dims = file_.integer(prefix + gguf_keys::ROPE_DIMENSION_COUNT); rope_dims && *rope_dims != c.head_size())
    throw std::runtime_error(file_.path() + ": metadata '" + prefix + gguf_keys::ROPE_DIMENSION_COUNT + "' is " + std::to_string(*rope_dims) +
                             ": RoPE over part of a head (" + std::to_string(c.head_size()) + " values) is not supported");
  c.norm_eps = static_cast<float>(file_.number(prefix + gguf_keys::RMS_EPSILON).value_or(1e-5));
  c.rope_theta = static_cast<float>(file_.number(prefix + gguf_keys::ROPE_FREQ_BASE).value_or(10000.0));
  c.rope_freq_factors = rope_frequency_factors(c.head_size());
  const gguf::TensorInfo* embedding = file_.tensor("token_embd.weight");
  if (!embedding || embedding->ne.size() != 2) throw std::runtime_error(file_.path() + ": tensor 'token_embd.weight' is missing or not 2-D");
  c.vocab_size = static_cast<int>(embedding->ne[1]);
  c.shared_classifier = file_.tensor("output.weight") == nullptr;
  if (const auto window = file_.integer(prefix + gguf_keys::SLIDING_WINDOW))  // positions beyond it are not served
    c.seq_len = static_cast<int>(std::min<int64_t>(c.seq_len, *window));
  if (architecture_ == "qwen2") {
    c.qkv_bias = true;
    c.hf_architecture = "Qwen2ForCausalLM";
  } else if (architecture_ == "phi3") {
    c.hf_architecture = "Phi3ForCausalLM";
  } else if (const auto experts = file_.integer(prefix + gguf_keys::EXPERT_COUNT); experts && *experts > 0) {
    c.n_experts = static_cast<int>(*experts);
    c.top_k = static_cast<int>(file_.integer(prefix + gguf_keys::EXPERT_USED_COUNT).value_or(2));
    c.hf_architecture = "MixtralForCausalLM";
  } else {
    c.hf_architecture = "LlamaForCausalLM";
  }
  try {
    c.validate();
  } catch (const std::exception& e) {
    throw std::runtime_error(file_.path() + ": " + e.what());
  }
  return c;
}

std::vector<float> GgufModel::rope_frequency_factors(int head_size) const {
  const gguf::TensorInfo* t = file_.tensor(gguf_keys::ROPE_FREQS_TENSOR);
  if (!t) return {};
  const auto refuse = [&](const std::string& what) {
    return std::runtime_error(file_.path() + ": tensor '" + gguf_keys::ROPE_FREQS_TENSOR + "' " + what);
  };
  const size_t pairs = static_cast<size_t>(head_size / 2);
  if (t->ne.size() != 1 || t->ne[0] != pairs)
    throw refuse("is " + shape_text(tensor::Shape(t->ne.rbegin(), t->ne.rend())) + ", the head size " + std::to_string(head_size) +
                 " needs [" + std::to_string(pairs) + "] (a factor per pair of RoPE dimensions)");
  if (t->type != tensor::GgmlType::F32 && t->type != tensor::GgmlType::F16 && t->type != tensor::GgmlType::BF16)
    throw refuse("is of type " + std::string(tensor::ggml_traits(t->type).name) + ", not a float type");
  std::vector<float> factors(pairs);
  tensor::dequantize_row(t->type, t->data.data(), factors.data(), static_cast<int64_t>(pairs));
  for (const float f : factors)
    if (!std::isfinite(f) || f <= 0) throw refuse("holds " + std::to_string(f) + ", not a finite factor > 0");
  return factors;
}

GgufModel::TensorSlice GgufModel::slice_of(const std::string& name) const {
  if (name == "tok_embeddings") return {"token_embd.weight"};
  if (name == "norm") return {"output_norm.weight"};
  if (name == "output") return {"output.weight"};
  const auto parsed = model::parse_tensor_name(name);
  if (!parsed || !parsed->rest.empty()) throw std::out_of_range(file_.path() + ": no tensor for parameter '" + name + "'");
  const std::string block = "blk." + std::to_string(parsed->key.layer) + ".";
  const model::MatrixFacts& f = model::facts(parsed->key.matrix);
  if (architecture_ != "phi3" || !f.fused_hf_module) return {block + f.gguf};
  // Phi-3 stores q|k|v as attn_qkv and gate|up as ffn_up, parts in order, as its HF directory does.
  TensorSlice slice{block + (parsed->key.matrix == model::Matrix::W1 || parsed->key.matrix == model::Matrix::W3 ? "ffn_up.weight" : "attn_qkv.weight")};
  for (const model::Matrix part : model::linear_parts(parsed->key.matrix)) {
    const int64_t rows = model::block_shape(part, config_)[0];
    if (part == parsed->key.matrix) {
      slice.rows = rows;
      break;
    }
    slice.first_row += rows;
  }
  return slice;
}

void GgufModel::check_tensors() const {
  std::map<std::string, int64_t> fused_rows;  // a fused tensor's rows: the sum of its parts'
  for (const model::ParamSpec& p : model::llama_parameters(config_)) {
    const TensorSlice& slice = slices_.at(p.name);
    const gguf::TensorInfo* t = file_.tensor(slice.tensor);
    if (!t) throw std::runtime_error(file_.path() + ": tensor '" + slice.tensor + "' is missing");
    tensor::Shape shape(t->ne.rbegin(), t->ne.rend());
    if (slice.rows > 0) {
      fused_rows[slice.tensor] += slice.rows;
      shape[0] = slice.rows;
    }
    if (shape != p.shape)
      throw std::runtime_error(file_.path() + ": tensor '" + slice.tensor + "' is " + shape_text(shape) + ", the model needs " +
                               shape_text(p.shape));
    if (!tensor::ggml_traits(t->type).dequantizable)
      throw std::runtime_error(file_.path() + ": tensor '" + slice.tensor + "' is of type " + tensor::ggml_traits(t->type).name +
                               ", which tpcli does not read");
  }
  for (const auto& [name, rows] : fused_rows)
    if (static_cast<int64_t>(file_.tensor(name)->rows()) != rows)
      throw std::runtime_error(file_.path() + ": tensor '" + name + "' has " + std::to_string(file_.tensor(name)->rows()) +
                               " rows, its parts need " + std::to_string(rows));
}

const GgufModel::TensorSlice& GgufModel::slice(const std::string& name) const {
  const auto it = slices_.find(name);
  if (it == slices_.end()) throw std::out_of_range(file_.path() + ": no parameter '" + name + "'");
  return it->second;
}

int GgufModel::rope_heads_to_reorder(const std::string& name) const {
  if (architecture_ == "llama") return 0;  // llama.cpp's converter stored them in interleaved pairs already
  const auto parsed = model::parse_tensor_name(name);
  return parsed ? model::rope_heads(parsed->key.matrix, config_) : 0;
}

std::span<const float> GgufModel::get(const std::string& name) const {
  const TensorSlice& part = slice(name);
  const gguf::TensorInfo& t = *file_.tensor(part.tensor);
  const int64_t row = static_cast<int64_t>(t.ne[0]), rows = part.rows > 0 ? part.rows : static_cast<int64_t>(t.rows());
  const tensor::GgmlTypeTraits& traits = tensor::ggml_traits(t.type);
  const size_t row_bytes = static_cast<size_t>(row / traits.block_elements * traits.block_bytes);
  const std::byte* first = t.data.data() + static_cast<size_t>(part.first_row) * row_bytes;
  const int rope_heads = rope_heads_to_reorder(name);
  if (t.type == tensor::GgmlType::F32 && rope_heads == 0 && reinterpret_cast<uintptr_t>(first) % alignof(float) == 0)
    return {reinterpret_cast<const float*>(first), static_cast<size_t>(rows * row)};
  std::lock_guard<std::mutex> lock(mutex_);
  auto [it, added] = dequantized_.try_emplace(name);
  if (added) {
    std::vector<float> values(static_cast<size_t>(rows * row));
    for (int64_t r = 0; r < rows; ++r) tensor::dequantize_row(t.type, first + r * row_bytes, values.data() + r * row, row);
    if (rope_heads > 0) {  // rotate-half rows (NEOX RoPE) into tpcli's interleaved pairs
      std::vector<float> reordered(values.size());
      const bool vector = t.ne.size() == 1;  // a bias or a norm: each value is a row
      const int64_t heads_rows = vector ? row : rows;
      rope_rows_from_hf(reinterpret_cast<std::byte*>(reordered.data()), reinterpret_cast<const std::byte*>(values.data()), rope_heads,
                        static_cast<int>(heads_rows / rope_heads), static_cast<size_t>(vector ? 1 : row) * sizeof(float));
      values = std::move(reordered);
    }
    it->second = std::move(values);
  }
  return it->second;
}

std::optional<model::StoredTensor> GgufModel::stored(const std::string& name) const {
  const TensorSlice& part = slice(name);
  const gguf::TensorInfo& t = *file_.tensor(part.tensor);
  if (t.type == tensor::GgmlType::F32 || t.ne.size() < 2) return std::nullopt;
  const int64_t cols = static_cast<int64_t>(t.ne[0]), rows = part.rows > 0 ? part.rows : static_cast<int64_t>(t.rows());
  const tensor::GgmlTypeTraits& traits = tensor::ggml_traits(t.type);
  const size_t row_bytes = static_cast<size_t>(cols / traits.block_elements * traits.block_bytes);
  const std::byte* data = t.data.data() + static_cast<size_t>(part.first_row) * row_bytes;
  if (const int rope_heads = rope_heads_to_reorder(name)) {  // rotate-half rows (NEOX RoPE) into interleaved pairs
    std::lock_guard<std::mutex> lock(mutex_);
    auto [it, added] = reordered_.try_emplace(name);
    if (added) {
      it->second.resize(static_cast<size_t>(rows) * row_bytes);
      rope_rows_from_hf(it->second.data(), data, rope_heads, static_cast<int>(rows / rope_heads), row_bytes);
    }
    data = it->second.data();
  }
  model::StoredTensor out{model::DType::U8, {rows, cols}, data};
  if (t.type == tensor::GgmlType::F16) out.dtype = model::DType::F16;
  else if (t.type == tensor::GgmlType::BF16) out.dtype = model::DType::BF16;
  else out.ggml_blocks = t.type;
  return out;
}

void GgufModel::release_conversions() const {
  std::lock_guard<std::mutex> lock(mutex_);
  dequantized_.clear();
  reordered_.clear();
}

void GgufModel::release_pages(const std::string& name) const {
  const gguf::TensorInfo& t = *file_.tensor(slice(name).tensor);
  file_.release_pages(t);
}

void GgufModel::release_all_pages() const { file_.release_all_pages(); }

}  // namespace tpcli::formats
