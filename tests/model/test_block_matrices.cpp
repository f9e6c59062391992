// model/block_matrices.h: the one table of a block's parameters, checked against what the files
// and the other layers expect of it (llama2.c's order, Hugging Face's and PEFT's names, Phi-3's
// fused rows, config::LORA_MODULES) written out here by hand.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "config/run_config.h"
#include "formats/hf_names.h"
#include "model/block_matrices.h"
#include "model/llama_config.h"

using namespace tpcli;
using model::BlockKey;
using model::Matrix;

namespace {

model::LlamaConfig every_feature() {
  model::LlamaConfig c;
  c.dim = 16, c.hidden_dim = 24, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.vocab_size = 32, c.seq_len = 8;
  c.head_dim = 6;  // Q = 24, KV = 12, HS = 6
  c.qkv_bias = c.qk_norm = true;
  c.n_experts = 4, c.top_k = 2, c.expert_hidden_dim = 10;
  c.dense_layers = {1};
  c.shared_classifier = false;
  return c;
}

}  // namespace

TEST_CASE("block matrices: llama_parameters lists a block's parameters in llama2.c's order with their shapes and splits",
          "[block]") {
  const model::LlamaConfig c = every_feature();
  struct Want {
    std::string name;
    tensor::Shape shape;
    model::Split split;
    model::ShardedDim dim;
  };
  using model::ShardedDim;
  using model::Split;
  const std::vector<Want> want = {
      {"tok_embeddings", {32, 16}, Split::Rows, ShardedDim::Vocab},
      {"layers.0.attention_norm", {16}, Split::Replicated, ShardedDim::None},
      {"layers.1.attention_norm", {16}, Split::Replicated, ShardedDim::None},
      {"layers.0.wq", {24, 16}, Split::Rows, ShardedDim::QueryHeads},
      {"layers.1.wq", {24, 16}, Split::Rows, ShardedDim::QueryHeads},
      {"layers.0.wk", {12, 16}, Split::Rows, ShardedDim::KvHeads},
      {"layers.1.wk", {12, 16}, Split::Rows, ShardedDim::KvHeads},
      {"layers.0.wv", {12, 16}, Split::Rows, ShardedDim::KvHeads},
      {"layers.1.wv", {12, 16}, Split::Rows, ShardedDim::KvHeads},
      {"layers.0.wo", {16, 24}, Split::Columns, ShardedDim::QueryHeads},
      {"layers.1.wo", {16, 24}, Split::Columns, ShardedDim::QueryHeads},
      {"layers.0.bq", {24}, Split::Rows, ShardedDim::QueryHeads},
      {"layers.1.bq", {24}, Split::Rows, ShardedDim::QueryHeads},
      {"layers.0.bk", {12}, Split::Rows, ShardedDim::KvHeads},
      {"layers.1.bk", {12}, Split::Rows, ShardedDim::KvHeads},
      {"layers.0.bv", {12}, Split::Rows, ShardedDim::KvHeads},
      {"layers.1.bv", {12}, Split::Rows, ShardedDim::KvHeads},
      {"layers.0.q_norm", {6}, Split::Replicated, ShardedDim::None},
      {"layers.1.q_norm", {6}, Split::Replicated, ShardedDim::None},
      {"layers.0.k_norm", {6}, Split::Replicated, ShardedDim::None},
      {"layers.1.k_norm", {6}, Split::Replicated, ShardedDim::None},
      {"layers.0.ffn_norm", {16}, Split::Replicated, ShardedDim::None},
      {"layers.1.ffn_norm", {16}, Split::Replicated, ShardedDim::None},
      {"layers.0.router", {4, 16}, Split::Replicated, ShardedDim::None},
      {"layers.0.experts.w1", {4, 10, 16}, Split::Rows, ShardedDim::Experts},
      {"layers.0.experts.w2", {4, 16, 10}, Split::Columns, ShardedDim::Experts},
      {"layers.0.experts.w3", {4, 10, 16}, Split::Rows, ShardedDim::Experts},
      {"layers.1.w1", {24, 16}, Split::Rows, ShardedDim::Hidden},
      {"layers.1.w2", {16, 24}, Split::Columns, ShardedDim::Hidden},
      {"layers.1.w3", {24, 16}, Split::Rows, ShardedDim::Hidden},
      {"norm", {16}, Split::Replicated, ShardedDim::None},
      {"output", {32, 16}, Split::Rows, ShardedDim::Vocab},
  };
  const std::vector<model::ParamSpec> specs = model::llama_parameters(c);
  REQUIRE(specs.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO(want[i].name);
    CHECK(specs[i].name == want[i].name);
    CHECK(specs[i].shape == want[i].shape);
    CHECK(specs[i].split == want[i].split);
    CHECK(specs[i].sharded_dim == want[i].dim);
    CHECK(specs[i].weight_decay == (want[i].shape.size() >= 2));
    CHECK(specs[i].expert == (want[i].dim == ShardedDim::Experts));
    CHECK(specs[i].kv_heads == (want[i].dim == ShardedDim::KvHeads));
    // a block's parameter carries its key, and the key names it
    CHECK(specs[i].block.has_value() == specs[i].name.starts_with("layers."));
    if (specs[i].block) CHECK(model::tensor_name(*specs[i].block) == specs[i].name);
  }
}

TEST_CASE("block matrices: a key becomes a name and back, and other names are refused", "[block]") {
  for (const model::MatrixFacts& f : model::block_matrices())
    for (int l : {0, 7, 123456}) {
      const BlockKey key{l, f.matrix};
      const std::string name = model::tensor_name(key);
      CHECK(name == "layers." + std::to_string(l) + "." + f.name);
      const auto parsed = model::parse_tensor_name(name);
      REQUIRE(parsed);
      CHECK(parsed->key == key);
      CHECK(parsed->rest.empty());
      const auto lora = model::parse_tensor_name(name + ".lora_b");
      REQUIRE(lora);
      CHECK(lora->key == key);
      CHECK(lora->rest == "lora_b");
    }
  CHECK(model::parse_tensor_name("layers.2.experts.w1")->key == BlockKey{2, Matrix::ExpertsW1});
  CHECK(model::parse_tensor_name("layers.2.w1")->key == BlockKey{2, Matrix::W1});
  for (const char* bad : {"layers.x.wq", "layers.0.wz", "layers.0.wqx", "layers.1234567.wq", "layer.0.wq", "layers.0",
                          "layers..wq", "layers.0.experts", "tok_embeddings", "model.layers.0.wq"})
    CHECK_FALSE(model::parse_tensor_name(bad));
}

TEST_CASE("block matrices: LoRA's matrices are PEFT's target modules, the ones config::LORA_MODULES lists", "[block][lora]") {
  std::vector<std::string> peft;
  for (Matrix m : model::lora_matrix_order()) peft.emplace_back(model::facts(m).peft);
  CHECK(peft == std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"});
  CHECK(peft == config::LORA_MODULES);
  int adaptable = 0;
  for (const model::MatrixFacts& f : model::block_matrices())
    if (f.peft) {
      ++adaptable;
      CHECK(model::matrix_of_peft(f.peft) == f.matrix);
      // PEFT's target name is the leaf of the module Hugging Face stores the matrix in
      CHECK(std::string(f.hf_module).ends_with(std::string(".") + f.peft));
    }
  CHECK(adaptable == 7);
  CHECK_FALSE(model::matrix_of_peft("qkv_proj"));
  CHECK(model::matrix_named("experts.w2") == Matrix::ExpertsW2);
  CHECK_FALSE(model::matrix_named("q_proj"));
}

TEST_CASE("block matrices: the parts of a fused linear, and where Hugging Face keeps each matrix", "[block][hf]") {
  CHECK(model::linear_name(Matrix::Wk) == "wq|wk|wv");
  CHECK(model::linear_name(Matrix::W3) == "w1|w3");
  CHECK(model::linear_name(Matrix::Wo) == "wo");
  CHECK(model::linear_name(Matrix::W2) == "w2");
  CHECK(model::linear_parts(Matrix::W1) == std::vector<Matrix>{Matrix::W1, Matrix::W3});

  model::LlamaConfig c = every_feature();
  c.n_experts = 0, c.dense_layers.clear();
  const int64_t Q = 24, KV = 12, F = 24;
  // Llama's names (convert_llama_weights_to_hf.py); rope_heads: q's and k's rows are reordered
  struct Want {
    Matrix m;
    const char* module;
    const char* kind;
    int rope_heads;
  };
  for (const Want& w : {Want{Matrix::AttentionNorm, "model.layers.1.input_layernorm", "weight", 0},
                        Want{Matrix::Wq, "model.layers.1.self_attn.q_proj", "weight", 4},
                        Want{Matrix::Wk, "model.layers.1.self_attn.k_proj", "weight", 2},
                        Want{Matrix::Wv, "model.layers.1.self_attn.v_proj", "weight", 0},
                        Want{Matrix::Wo, "model.layers.1.self_attn.o_proj", "weight", 0},
                        Want{Matrix::Bq, "model.layers.1.self_attn.q_proj", "bias", 4},
                        Want{Matrix::Bk, "model.layers.1.self_attn.k_proj", "bias", 2},
                        Want{Matrix::Bv, "model.layers.1.self_attn.v_proj", "bias", 0},
                        Want{Matrix::QNorm, "model.layers.1.self_attn.q_norm", "weight", 1},
                        Want{Matrix::KNorm, "model.layers.1.self_attn.k_norm", "weight", 1},
                        Want{Matrix::FfnNorm, "model.layers.1.post_attention_layernorm", "weight", 0},
                        Want{Matrix::W1, "model.layers.1.mlp.gate_proj", "weight", 0},
                        Want{Matrix::W2, "model.layers.1.mlp.down_proj", "weight", 0},
                        Want{Matrix::W3, "model.layers.1.mlp.up_proj", "weight", 0}}) {
    const formats::HfTensorRef ref = formats::hf_tensor_of(BlockKey{1, w.m}, c, "LlamaForCausalLM");
    INFO(w.module);
    CHECK(ref.modules == std::vector<std::string>{w.module});
    CHECK(ref.kind == w.kind);
    CHECK(ref.rope_heads == w.rope_heads);
    CHECK(ref.fused_rows == 0);
  }
  // Phi-3: qkv_proj rows [0, Q) wq, [Q, Q+KV) wk, [Q+KV, Q+2KV) wv; gate_up_proj [0, F) w1, [F, 2F) w3
  struct Segment {
    Matrix m;
    const char* module;
    int64_t offset, rows, fused;
  };
  for (const Segment& s : {Segment{Matrix::Wq, "model.layers.0.self_attn.qkv_proj", 0, Q, Q + 2 * KV},
                           Segment{Matrix::Wk, "model.layers.0.self_attn.qkv_proj", Q, KV, Q + 2 * KV},
                           Segment{Matrix::Wv, "model.layers.0.self_attn.qkv_proj", Q + KV, KV, Q + 2 * KV},
                           Segment{Matrix::W1, "model.layers.0.mlp.gate_up_proj", 0, F, 2 * F},
                           Segment{Matrix::W3, "model.layers.0.mlp.gate_up_proj", F, F, 2 * F}}) {
    const formats::HfTensorRef ref = formats::hf_tensor_of(BlockKey{0, s.m}, c, "Phi3ForCausalLM");
    INFO(s.module);
    CHECK(ref.modules == std::vector<std::string>{s.module});
    CHECK(ref.row_offset == s.offset);
    CHECK(ref.rows == s.rows);
    CHECK(ref.fused_rows == s.fused);
  }
  // a MoE parameter has no name in a dense architecture
  CHECK_THROWS(formats::hf_tensor_of(BlockKey{0, Matrix::Router}, c, "LlamaForCausalLM"));
  CHECK_THROWS(formats::hf_tensor_of("layers.0.nonsense", c, "LlamaForCausalLM"));
}
