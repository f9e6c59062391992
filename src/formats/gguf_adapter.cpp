// tpcli::formats — llama.cpp's GGUF LoRA adapters (see gguf_adapter.h).
#include "formats/gguf_adapter.h"

#include <cmath>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "formats/gguf_file.h"
#include "formats/gguf_keys.h"
#include "formats/gguf_model.h"  // looks_like_gguf
#include "formats/hf_names.h"    // rope_rows_from_hf
#include "formats/peft_adapter.h"
#include "model/block_matrices.h"
#include "tensor/ggml_blocks.h"

namespace tpcli::formats {

namespace {

constexpr const char* GENERAL_TYPE = "general.type";
constexpr const char* ADAPTER_TYPE = "adapter.type";
constexpr const char* LORA_ALPHA = "adapter.lora.alpha";

// The GGUF architecture a model of `c` is stored as, whose tensor layout its adapters follow.
std::string gguf_architecture_of_model(const model::LlamaConfig& c) {
  const std::string& hf = c.hf_architecture;
  if (hf == "Qwen2ForCausalLM") return "qwen2";
  if (hf == "Phi3ForCausalLM") return "phi3";
  if (hf.empty() || hf == "LlamaForCausalLM" || hf == "MistralForCausalLM" || hf == "MixtralForCausalLM") return "llama";
  return hf;
}

std::string shape_text(const tensor::Shape& s) { return tensor::to_string(s); }

// A tensor's shape in tpcli's order (rows first): ggml's ne reversed.
tensor::Shape shape_of(const gguf::TensorInfo& t) { return tensor::Shape(t.ne.rbegin(), t.ne.rend()); }

// One lora_a / lora_b pair of the file: the block, the matrices it adapts (several for Phi-3's fused
// tensors, whose B rows are theirs in order and whose A all of them share), and its two tensors.
struct GgufPair {
  int layer = 0;
  std::vector<model::Matrix> parts;
  std::string tensor;  // the base's: "attn_q.weight"
  const gguf::TensorInfo* a = nullptr;
  const gguf::TensorInfo* b = nullptr;
};

class AdapterReader {
 public:
  AdapterReader(const gguf::GgufFile& file, const model::LlamaConfig& c) : file_(file), c_(c) {}

  model::LoraAdapterSet read() {
    check_metadata();
    collect_pairs();
    model::LoraAdapterSet set;
    set.rank = rank();
    const double alpha = alpha_of_file();
    set.alpha = alpha == 0 ? set.rank : alpha;  // llama.cpp: no alpha means scale 1
    std::set<model::Matrix> targets;
    for (const std::string& name : order_) {
      add_pair(set, pairs_.at(name));
      targets.insert(pairs_.at(name).parts.begin(), pairs_.at(name).parts.end());
    }
    for (model::Matrix m : model::lora_matrix_order())
      if (targets.count(m)) set.targets.emplace_back(model::facts(m).peft);
    try {
      model::validate_lora(set, c_, file_.path());
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error(e.what());
    }
    return set;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { throw std::runtime_error(file_.path() + ": " + what); }
  [[noreturn]] void fail_tensor(const gguf::TensorInfo& t, const std::string& what) const { fail("tensor " + gguf::printable(t.name) + ": " + what); }

  void check_metadata() {
    const auto general_type = file_.string(GENERAL_TYPE);
    if (general_type != "adapter")
      fail(std::string(GENERAL_TYPE) + " is " + (general_type ? "'" + gguf::printable(*general_type) + "'" : "missing") +
           ", not 'adapter': this GGUF is not a LoRA adapter (a model?)");
    const auto adapter_type = file_.string(ADAPTER_TYPE);
    if (adapter_type != "lora")
      fail(std::string(ADAPTER_TYPE) + " is " + (adapter_type ? "'" + gguf::printable(*adapter_type) + "'" : "missing") +
           ", not 'lora' (a control vector?)");
    const auto architecture = file_.string(gguf_keys::ARCHITECTURE);
    if (!architecture) fail(std::string(gguf_keys::ARCHITECTURE) + " is missing");
    architecture_ = *architecture;
    const std::string model_architecture = gguf_architecture_of_model(c_);
    if (architecture_ != model_architecture)
      fail(std::string(gguf_keys::ARCHITECTURE) + " is '" + gguf::printable(architecture_) + "', but the model is " + model_architecture);
    if (architecture_ != "llama" && architecture_ != "qwen2" && architecture_ != "phi3")
      fail(std::string(gguf_keys::ARCHITECTURE) + " '" + gguf::printable(architecture_) + "': adapters are read for llama, qwen2 and phi3");
  }

  double alpha_of_file() const {
    const double alpha = file_.number(LORA_ALPHA).value_or(0.0);
    if (!std::isfinite(alpha)) fail(std::string(LORA_ALPHA) + " is not finite");
    return alpha;
  }

  // blk.{l}.{name}.lora_{a,b} -> the pair of block l's matrix `name`.
  void collect_pairs() {
    static const std::regex re(R"(blk\.(\d{1,6})\.(\w+\.weight)\.lora_(a|b))");
    for (const gguf::TensorInfo& t : file_.tensors()) {
      std::smatch m;
      const std::vector<model::Matrix> parts = std::regex_match(t.name, m, re) ? matrices_of_gguf(m[2].str()) : std::vector<model::Matrix>{};
      if (parts.empty())
        fail_tensor(t, std::string("not the lora_a / lora_b of a block's ") +
                           (architecture_ == "phi3" ? "attn_qkv, attn_output, ffn_up (gate|up) or ffn_down"
                                                    : "attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up or ffn_down") +
                           ", the matrices tpcli adapts");
      const int layer = std::stoi(m[1].str());
      if (layer >= c_.n_layers) fail_tensor(t, "layer " + std::to_string(layer) + " beyond the model's " + std::to_string(c_.n_layers));
      if (model::facts(parts[0]).blocks == model::Blocks::Dense && c_.is_moe_layer(layer))
        fail_tensor(t, "layer " + std::to_string(layer) + " is a mixture of experts, with no dense " + m[2].str());
      if (t.ne.size() != 2) fail_tensor(t, "has " + std::to_string(t.ne.size()) + " dimensions, not 2");
      if (!tensor::ggml_traits(t.type).dequantizable)
        fail_tensor(t, std::string("of type ") + tensor::ggml_traits(t.type).name + ", which tpcli does not read");
      const std::string name = m[1].str() + "." + m[2].str();
      if (!pairs_.count(name)) order_.push_back(name);
      GgufPair& pair = pairs_[name];
      pair.layer = layer;
      pair.parts = parts;
      pair.tensor = m[2].str();
      (m[3].str() == "a" ? pair.a : pair.b) = &t;
    }
    if (pairs_.empty()) fail("holds no LoRA tensors");
    for (const std::string& name : order_) {
      const GgufPair& pair = pairs_.at(name);
      if (!pair.a) fail("tensor blk." + name + ".lora_b has no blk." + name + ".lora_a beside it");
      if (!pair.b) fail("tensor blk." + name + ".lora_a has no blk." + name + ".lora_b beside it");
    }
  }

  // The matrices base tensor `name` holds; none when tpcli adapts no such tensor. Phi-3 fuses
  // q|k|v as attn_qkv and gate|up as ffn_up, as its Hugging Face directory does.
  std::vector<model::Matrix> matrices_of_gguf(const std::string& name) const {
    if (architecture_ == "phi3") {
      if (name == "attn_qkv.weight") return model::linear_parts(model::Matrix::Wq);
      if (name == "ffn_up.weight") return model::linear_parts(model::Matrix::W1);
    }
    for (model::Matrix m : model::lora_matrix_order())
      if (name == model::facts(m).gguf && !(architecture_ == "phi3" && model::facts(m).fused_hf_module)) return {m};
    return {};
  }

  // The adapter's one rank: every lora_b's rows' length (llama.cpp's scale divides by it).
  int rank() const {
    const gguf::TensorInfo* first = pairs_.at(order_.front()).b;
    const uint64_t r = first->ne[0];
    if (r < 1 || r > 65536) fail_tensor(*first, "rank " + std::to_string(r) + " outside [1, 65536]");
    for (const std::string& name : order_)
      if (const gguf::TensorInfo* b = pairs_.at(name).b; b->ne[0] != r)
        fail_tensor(*b, "rank " + std::to_string(b->ne[0]) + ", but " + first->name + " has " + std::to_string(r) +
                                 ": tpcli applies one rank per adapter");
    return static_cast<int>(r);
  }

  // The pair's A [r, IN] and B [OUT, r] of each matrix it adapts, checked against the model, B's
  // q/k rows in tpcli's order.
  void add_pair(model::LoraAdapterSet& set, const GgufPair& pair) const {
    int64_t OUT = 0;  // every part's rows
    for (model::Matrix part : pair.parts) OUT += model::block_shape(part, c_)[0];
    const int64_t IN = model::block_shape(pair.parts[0], c_)[1], r = set.rank;
    const auto check = [&](const gguf::TensorInfo& t, const tensor::Shape& want, const char* role) {
      if (shape_of(t) != want)
        fail_tensor(t, "shape " + shape_text(shape_of(t)) + ", expected " + shape_text(want) + " (" + role + ") for this model, whose " +
                           pair.tensor + " is " + shape_text({OUT, IN}) + " (wrong base model?)");
    };
    if (pair.a->ne[1] != pair.b->ne[0])
      fail_tensor(*pair.a, "rank " + std::to_string(pair.a->ne[1]) + " but its lora_b's is " + std::to_string(pair.b->ne[0]));
    check(*pair.a, {r, IN}, "A [r, IN]");
    check(*pair.b, {OUT, r}, "B [OUT, r]");
    const std::vector<float> a = values(*pair.a), b = values(*pair.b);
    size_t first_row = 0;
    for (model::Matrix part : pair.parts) {
      const int64_t rows = model::block_shape(part, c_)[0];
      std::vector<float> part_b(b.begin() + static_cast<ptrdiff_t>(first_row * r), b.begin() + static_cast<ptrdiff_t>((first_row + rows) * r));
      first_row += static_cast<size_t>(rows);
      if (const int heads = architecture_ == "llama" ? 0 : model::rope_heads(part, c_)) {  // rotate-half rows, as the base's
        std::vector<float> reordered(part_b.size());
        rope_rows_from_hf(reinterpret_cast<std::byte*>(reordered.data()), reinterpret_cast<const std::byte*>(part_b.data()), heads,
                          static_cast<int>(rows / heads), static_cast<size_t>(r) * sizeof(float));
        part_b = std::move(reordered);
      }
      const model::BlockKey key{pair.layer, part};
      if (!set.tensors.emplace(model::lora_tensor_name(key, 'a'), tensor::Tensor({r, IN}, a)).second)  // "blk.01." beside "blk.1."
        fail_tensor(*pair.a, "a second adapter on layer " + std::to_string(pair.layer) + "'s " + pair.tensor);
      set.tensors.emplace(model::lora_tensor_name(key, 'b'), tensor::Tensor({rows, r}, std::move(part_b)));
    }
  }

  // A tensor's values in f32, as ggml dequantizes them; finite.
  std::vector<float> values(const gguf::TensorInfo& t) const {
    const tensor::GgmlTypeTraits& traits = tensor::ggml_traits(t.type);
    const int64_t row = static_cast<int64_t>(t.ne[0]), rows = static_cast<int64_t>(t.rows());
    const size_t row_bytes = static_cast<size_t>(row / traits.block_elements * traits.block_bytes);
    std::vector<float> out(static_cast<size_t>(row * rows));
    for (int64_t i = 0; i < rows; ++i) tensor::dequantize_row(t.type, t.data.data() + i * row_bytes, out.data() + i * row, row);
    for (size_t i = 0; i < out.size(); ++i)
      if (!std::isfinite(out[i])) fail_tensor(t, "non-finite value at element " + std::to_string(i));
    return out;
  }

  const gguf::GgufFile& file_;
  const model::LlamaConfig& c_;
  std::string architecture_;
  std::map<std::string, GgufPair> pairs_;  // "{l}.{name}" -> its tensors
  std::vector<std::string> order_;         // pairs_' keys in file order, so errors name the file's first
};

}  // namespace

model::LoraAdapterSet load_gguf_adapter(const std::string& path, const model::LlamaConfig& config) {
  const gguf::GgufFile file(path);
  return AdapterReader(file, config).read();
}

model::LoraAdapterSet load_adapter(const std::string& path, const model::LlamaConfig& config) {
  if (looks_like_gguf(path)) return load_gguf_adapter(path, config);
  std::error_code ignored;
  if (std::filesystem::is_regular_file(path, ignored))
    throw std::runtime_error(path + ": neither a GGUF LoRA adapter (no \"GGUF\" at its start) nor a PEFT adapter folder");
  return load_peft_adapter(path, config);
}

}  // namespace tpcli::formats
