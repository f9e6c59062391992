// tpcli::model — LoRA adapters in memory (see lora_adapter.h); PEFT's folder is formats/peft_adapter.cpp.
#include "model/lora_adapter.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <stdexcept>

#include "files/json_file.h"

namespace tpcli::model {

using files::quoted_value;

using tensor::Tensor;

namespace {

std::pair<int64_t, int64_t> matrix_shape(Matrix m, const LlamaConfig& c) {
  const tensor::Shape s = block_shape(m, c);
  return {s[0], s[1]};
}

bool is_ffn(Matrix m) { return facts(m).blocks == Blocks::Dense; }
const char* peft_name(Matrix m) { return facts(m).peft; }

std::string shape_text(int64_t a, int64_t b) { return tensor::to_string(tensor::Shape{a, b}); }

}  // namespace

std::optional<LoraKey> parse_lora_key(const std::string& name) {
  const auto parsed = parse_tensor_name(name);
  if (!parsed || !peft_name(parsed->key.matrix) || (parsed->rest != "lora_a" && parsed->rest != "lora_b")) return std::nullopt;
  return LoraKey{parsed->key, parsed->rest.back()};
}

std::string lora_tensor_name(BlockKey key, char side) { return tensor_name(key) + ".lora_" + side; }

std::vector<int> adapted_layers(const LoraAdapterSet& set) {
  std::set<int> layers;
  for (const auto& [name, t] : set.tensors)
    if (auto k = parse_lora_key(name)) layers.insert(k->layer());
  return {layers.begin(), layers.end()};
}


const std::vector<std::string>& lora_matrices() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (Matrix m : lora_matrix_order()) v.emplace_back(facts(m).name);
    return v;
  }();
  return names;
}

std::optional<std::string> lora_matrix_of(const std::string& hf_module) {
  if (const auto m = matrix_of_peft(hf_module)) return std::string(facts(*m).name);
  return std::nullopt;
}

std::optional<std::string> lora_hf_module_of(const std::string& matrix) {
  if (const auto m = matrix_named(matrix); m && peft_name(*m)) return std::string(peft_name(*m));
  return std::nullopt;
}

void validate_lora(const LoraAdapterSet& set, const LlamaConfig& c, const std::string& origin) {
  auto fail = [&](const std::string& what) { throw std::invalid_argument(origin + ": " + what); };
  if (set.rank < 1) fail("LoRA rank " + std::to_string(set.rank) + " must be >= 1");
  if (!std::isfinite(set.alpha) || set.alpha == 0) fail("lora_alpha " + std::to_string(set.alpha) + " must be finite and nonzero");
  if (set.targets.empty()) fail("no target modules");
  std::set<Matrix> targets;
  for (const auto& t : set.targets) {
    const auto m = matrix_of_peft(t);
    if (!m) fail("target module " + quoted_value(t) + " is not one of q_proj k_proj v_proj o_proj gate_proj up_proj down_proj");
    if (!targets.insert(*m).second) fail("target module " + t + " listed twice");
  }
  const int64_t r = set.rank;
  for (const auto& [name, t] : set.tensors) {
    const auto k = parse_lora_key(name);
    if (!k) fail("tensor " + quoted_value(name) + " is not named layers.L.{wq,wk,wv,wo,w1,w3,w2}.lora_{a,b}");
    if (!targets.count(k->matrix())) fail("tensor " + name + ": " + peft_name(k->matrix()) + " is not a target module");
    if (k->layer() >= c.n_layers) fail("tensor " + name + ": the model has " + std::to_string(c.n_layers) + " layers");
    if (is_ffn(k->matrix()) && c.is_moe_layer(k->layer()))
      fail("tensor " + name + ": layer " + std::to_string(k->layer()) + " is a mixture of experts, with no dense " +
           facts(k->matrix()).name);
    const auto [OUT, IN] = matrix_shape(k->matrix(), c);
    const tensor::Shape want = k->side == 'a' ? tensor::Shape{r, IN} : tensor::Shape{OUT, r};
    if (t.shape() != want)
      fail("tensor " + name + " has shape " + tensor::to_string(t.shape()) + ", expected " + tensor::to_string(want) +
           " (rank " + std::to_string(r) + ")");
    for (int64_t i = 0; i < t.numel(); ++i)
      if (!std::isfinite(t[i])) fail("tensor " + name + " holds a non-finite value at element " + std::to_string(i));
    if (!set.tensors.count(lora_tensor_name(k->key, k->side == 'a' ? 'b' : 'a')))
      fail("tensor " + name + " has no " + (k->side == 'a' ? "lora_b" : "lora_a") + " beside it");
  }
}

bool lora_adapts(const LoraAdapterSet& set, const std::string& name) { return set.tensors.count(name + ".lora_a") != 0; }

std::vector<float> lora_merged(const LoraAdapterSet& set, const std::string& name, std::span<const float> w, int64_t OUT,
                               int64_t IN) {
  const Tensor& a = set.tensors.at(name + ".lora_a");  // [r, IN]
  const Tensor& b = set.tensors.at(name + ".lora_b");  // [OUT, r]
  const int64_t r = a.dim(0);
  if (static_cast<int64_t>(w.size()) != OUT * IN || a.dim(1) != IN || b.dim(0) != OUT || b.dim(1) != r)
    throw std::invalid_argument("lora: " + name + " does not fit " + shape_text(OUT, IN));
  const float scale = set.scale();
  std::vector<float> out(w.begin(), w.end());  // [OUT, IN]
  std::vector<double> row(static_cast<size_t>(IN));
  for (int64_t o = 0; o < OUT; ++o) {
    std::fill(row.begin(), row.end(), 0.0);
    for (int64_t k = 0; k < r; ++k) {
      const double bk = b[o * r + k];
      const float* ak = a.data() + k * IN;
      for (int64_t i = 0; i < IN; ++i) row[static_cast<size_t>(i)] += bk * ak[i];
    }
    for (int64_t i = 0; i < IN; ++i) out[static_cast<size_t>(o * IN + i)] += static_cast<float>(scale * row[static_cast<size_t>(i)]);
  }
  return out;
}

AdaptedWeights::AdaptedWeights(std::unique_ptr<WeightSource> base, LoraAdapterSet set, const std::string& origin)
    : base_(std::move(base)), set_(std::move(set)) {
  validate_lora(set_, base_->config(), origin);
}

// ---- LoraMergedWeights ----

LoraMergedWeights::LoraMergedWeights(const WeightSource& base, const LoraAdapterSet& set, const std::string& origin)
    : base_(base), set_(set), config_(base.config()) {
  validate_lora(set_, config_, origin);
  config_.quantization.reset();
}

std::span<const float> LoraMergedWeights::get(const std::string& name) const {
  if (!lora_adapts(set_, name)) return base_.get(name);
  const std::lock_guard lock(merged_mutex_);
  auto it = merged_.find(name);
  if (it == merged_.end()) {
    const auto k = parse_lora_key(name + ".lora_a");
    const auto [OUT, IN] = matrix_shape(k->matrix(), config_);
    it = merged_.emplace(name, lora_merged(set_, name, base_.get(name), OUT, IN)).first;
  }
  return it->second;
}

std::optional<StoredTensor> LoraMergedWeights::stored(const std::string& name) const {
  if (lora_adapts(set_, name) || base_.config().quantization) return std::nullopt;
  return base_.stored(name);
}

void LoraMergedWeights::release_conversions() const {
  base_.release_conversions();
  const std::lock_guard lock(merged_mutex_);
  merged_.clear();
}

}  // namespace tpcli::model

