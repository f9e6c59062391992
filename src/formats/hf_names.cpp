// tpcli::formats — Hugging Face tensor names by architecture (see hf_names.h).
#include "formats/hf_names.h"

#include <cstring>
#include <stdexcept>
#include <utility>

#include "formats/hf_architectures.h"

namespace tpcli::formats {

using model::parse_tensor_name;

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

// The rows of a fused tensor (Phi-3's qkv_proj, gate_up_proj) that hold part m: after the parts
// before it (model/block_matrices.h linear_parts).
HfTensorRef fused_segment(const std::string& block, model::Matrix m, const model::LlamaConfig& c) {
  const model::MatrixFacts& f = facts(m);
  HfTensorRef ref{{block + f.fused_hf_module}, "weight", rope_heads(m, c)};
  for (model::Matrix part : linear_parts(m)) {
    const int64_t rows = block_shape(part, c)[0];
    if (facts(part).part < f.part) ref.row_offset += rows;
    if (part == m) ref.rows = rows;
    ref.fused_rows += rows;
  }
  return ref;
}

// A MoE block's router and experts (one tensor each, or mlx-lm's switch_mlp stack).
HfTensorRef moe_tensor(const std::string& block, model::Matrix m, const model::LlamaConfig& c, const HfArchitecture& a) {
  const std::string moe = block + a.moe_block + ".";
  const char* module = facts(m).hf_module;
  if (m == model::Matrix::Router) return {{moe + module}};
  const char* expert = m == model::Matrix::ExpertsW1 ? a.expert_w1 : m == model::Matrix::ExpertsW2 ? a.expert_w2 : a.expert_w3;
  HfTensorRef ref;
  for (int e = 0; e < c.n_experts; ++e) ref.modules.push_back(moe + "experts." + std::to_string(e) + "." + expert);
  ref.stacked_module = moe + "switch_mlp." + module;
  return ref;
}

}  // namespace

HfTensorRef hf_tensor_of(model::BlockKey key, const model::LlamaConfig& c, const std::string& architecture) {
  const model::MatrixFacts& f = facts(key.matrix);
  const HfArchitecture& a = hf_architecture(architecture);
  const std::string block = "model.layers." + std::to_string(key.layer) + ".";
  if (f.blocks == model::Blocks::Moe) {
    if (!a.is_moe()) throw std::invalid_argument("hf: parameter '" + tensor_name(key) + "' has no " + architecture + " name");
    return moe_tensor(block, key.matrix, c, a);
  }
  if (a.fused_projections && f.fused_hf_module) return fused_segment(block, key.matrix, c);
  return {{block + f.hf_module}, f.hf_kind, rope_heads(key.matrix, c)};
}

HfTensorRef hf_tensor_of(const std::string& name, const model::LlamaConfig& c, const std::string& architecture) {
  if (name == "tok_embeddings") return {{"model.embed_tokens"}};
  if (name == "norm") return {{"model.norm"}};
  if (name == "output") return {{"lm_head"}};
  if (const auto parsed = parse_tensor_name(name); parsed && parsed->rest.empty()) return hf_tensor_of(parsed->key, c, architecture);
  throw std::invalid_argument("hf: parameter '" + name + "' has no " + architecture + " name");
}

}  // namespace tpcli::formats
