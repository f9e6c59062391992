// tpcli::formats — llama.cpp's GGUF LoRA adapters (see gguf_adapter.h).
#include "formats/gguf_adapter.h"

#include <cmath>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <stdexcept>

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

// One lora_a / lora_b pair of the file: the matrix it adapts and its two tensors.
struct GgufPair {
  model::BlockKey key;
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
      targets.insert(pairs_.at(name).key.matrix);
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
      const auto matrix = std::regex_match(t.name, m, re) ? matrix_of_gguf(m[2].str()) : std::nullopt;
      if (!matrix)
        fail_tensor(t, "not the lora_a / lora_b of a block's attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up or ffn_down, "
                       "the matrices tpcli adapts");
      if (architecture_ == "phi3" && model::facts(*matrix).fused_hf_module)
        fail_tensor(t, "Phi-3's fused attn_qkv / ffn_up (gate|up) adapters are not read");
      const int layer = std::stoi(m[1].str());
      if (layer >= c_.n_layers) fail_tensor(t, "layer " + std::to_string(layer) + " beyond the model's " + std::to_string(c_.n_layers));
      if (model::facts(*matrix).blocks == model::Blocks::Dense && c_.is_moe_layer(layer))
        fail_tensor(t, "layer " + std::to_string(layer) + " is a mixture of experts, with no dense " + m[2].str());
      if (t.ne.size() != 2) fail_tensor(t, "has " + std::to_string(t.ne.size()) + " dimensions, not 2");
      if (!tensor::ggml_traits(t.type).dequantizable)
        fail_tensor(t, std::string("of type ") + tensor::ggml_traits(t.type).name + ", which tpcli does not read");
      const std::string name = m[1].str() + "." + m[2].str();
      if (!pairs_.count(name)) order_.push_back(name);
      GgufPair& pair = pairs_[name];
      pair.key = {layer, *matrix};
      (m[3].str() == "a" ? pair.a : pair.b) = &t;
    }
    if (pairs_.empty()) fail("holds no LoRA tensors");
    for (const std::string& name : order_) {
      const GgufPair& pair = pairs_.at(name);
      if (!pair.a) fail("tensor blk." + name + ".lora_b has no blk." + name + ".lora_a beside it");
      if (!pair.b) fail("tensor blk." + name + ".lora_a has no blk." + name + ".lora_b beside it");
    }
  }

  std::optional<model::Matrix> matrix_of_gguf(const std::string& name) const {
    for (model::Matrix m : model::lora_matrix_order())
      if (name == model::facts(m).gguf) return m;
    return std::nullopt;
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

  // The pair's A [r, IN] and B [OUT, r], checked against the model, B's q/k rows in tpcli's order.
  void add_pair(model::LoraAdapterSet& set, const GgufPair& pair) const {
    const tensor::Shape w = model::block_shape(pair.key.matrix, c_);
    const int64_t OUT = w[0], IN = w[1], r = set.rank;
    const std::string base = std::string(model::facts(pair.key.matrix).gguf);
    const auto check = [&](const gguf::TensorInfo& t, const tensor::Shape& want, const char* role) {
      if (shape_of(t) != want)
        fail_tensor(t, "shape " + shape_text(shape_of(t)) + ", expected " + shape_text(want) + " (" + role + ") for this model, whose " + base +
                           " is " + shape_text(w) + " (wrong base model?)");
    };
    if (pair.a->ne[1] != pair.b->ne[0])
      fail_tensor(*pair.a, "rank " + std::to_string(pair.a->ne[1]) + " but its lora_b's is " + std::to_string(pair.b->ne[0]));
    check(*pair.a, {r, IN}, "A [r, IN]");
    check(*pair.b, {OUT, r}, "B [OUT, r]");
    std::vector<float> b = values(*pair.b);
    if (const int heads = architecture_ == "llama" ? 0 : model::rope_heads(pair.key.matrix, c_)) {  // rotate-half rows, as the base's
      std::vector<float> reordered(b.size());
      rope_rows_from_hf(reinterpret_cast<std::byte*>(reordered.data()), reinterpret_cast<const std::byte*>(b.data()), heads,
                        static_cast<int>(OUT / heads), static_cast<size_t>(r) * sizeof(float));
      b = std::move(reordered);
    }
    set.tensors.emplace(model::lora_tensor_name(pair.key, 'a'), tensor::Tensor({r, IN}, values(*pair.a)));
    set.tensors.emplace(model::lora_tensor_name(pair.key, 'b'), tensor::Tensor({OUT, r}, std::move(b)));
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
