// Quantized (and 16-bit) checkpoints through the model: the same greedy tokens and close logits on
// 1..n_heads devices as on one device; on the real stories260K, logits close to the f32 model's
// (random-weight models amplify any rounding chaotically, so they are compared only sharded
// against unsharded); a safetensors round trip
// that keeps the packed words; the real stories260K quantized at group size 32; the one-line
// error for fully training a quantized model (QLoRA trains adapters on one:
// tests/train/test_qlora_train.cpp); a device count whose wo split cuts groups still decodes alike.
// Device threads record results; CHECKs run on the main thread.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "distributed/runtime.h"
#include "formats/dtype.h"
#include "formats/llama2c.h"
#include "formats/safetensors.h"
#include "model/llama.h"
#include "model/packed_weights.h"
#include "model/trainable_llama.h"
#include "nn/feed_forward.h"
#include "nn/moe.h"
#include "random_model.h"
#include "reference_files.h"
#include "support/temp_dir.h"
#include "text/tokenizer.h"

using namespace tpcli;
using model::LlamaConfig;
using model::TensorWeights;
using tensor::WeightFormat;
using testing::random_weights;

namespace {

struct Decoded {
  std::vector<int> tokens;    // greedy continuation
  std::vector<float> logits;  // [steps, V] of the forced prefix
};

// Greedy decode on a mesh (axis "model" splits the weights; a MoE's experts are dealt out over
// "data" when there is one, every member feeding the same tokens): `prefix` forced (its logits
// recorded), then `extra` greedy tokens. Every device's result, rank order.
std::vector<Decoded> decode_on(const model::WeightSource& w, const dist::Mesh& mesh, const std::vector<int>& prefix,
                               int extra) {
  std::vector<Decoded> out(static_cast<size_t>(mesh.size()));
  dist::run_on_mesh(mesh, [&](dist::Device& dev) {
    model::Llama m = mesh.has_axis("data") ? model::Llama(w, dev.axis("model"), dev.axis("data"))
                                           : model::Llama(w, dev.axis("model"));
    Decoded d;
    int pos = 0, token = prefix[0];
    for (; pos < static_cast<int>(prefix.size()); ++pos) {
      auto logits = m.forward(prefix[pos], pos);
      d.logits.insert(d.logits.end(), logits.begin(), logits.end());
      token = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    }
    for (int i = 0; i < extra; ++i, ++pos) {
      d.tokens.push_back(token);
      token = m.forward_argmax(token, pos);
    }
    out[static_cast<size_t>(dev.rank())] = std::move(d);
  });
  return out;
}

std::vector<Decoded> decode(const model::WeightSource& w, int T, const std::vector<int>& prefix, int extra) {
  return decode_on(w, dist::Mesh::line(T), prefix, extra);
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

double rms_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i] - b[i]) * (a[i] - b[i]);
  return std::sqrt(s / static_cast<double>(a.size()));
}

float max_abs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::abs(x));
  return m;
}

// dim 128, 4 heads of 32: every head is one group of 32, FFN 160 = 5 groups; vocab 64 (tied).
LlamaConfig small_config(bool shared) {
  return LlamaConfig{.dim = 128, .hidden_dim = 160, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .vocab_size = 64,
                     .seq_len = 24, .shared_classifier = shared};
}

}  // namespace

TEST_CASE("quantized model: same greedy tokens and logits on 1..n_heads devices as on one", "[llama][quantized]") {
  for (bool shared : {true, false}) {
    const TensorWeights f32 = random_weights(small_config(shared), 5);
    for (const auto& format : {WeightFormat::affine(4, 32), WeightFormat::affine(8, 32), WeightFormat::mxfp8(),
                               WeightFormat::bf16()}) {
      const model::ConvertedWeights w(f32, format);
      const std::vector<int> prefix = {1, 7, 33, 2, 60};
      const auto ref = decode(w, 1, prefix, 12)[0];
      const float scale = max_abs(ref.logits);
      for (int T = 2; T <= 4; ++T) {
        const auto got = decode(w, T, prefix, 12);
        for (int r = 0; r < T; ++r) {
          INFO(format.name() << (shared ? ", tied" : ", untied") << " classifier, " << T << " devices, device " << r);
          CHECK(got[r].tokens == ref.tokens);
          CHECK(max_abs_diff(got[r].logits, ref.logits) <= 1e-5f * scale);
        }
      }
    }
  }
}

// shard_bytes takes each parameter's fraction along the dimension the table splits it by: wq's
// rows and wo's columns are Q = NH * head_dim (not C), the q/k/v biases are split with their rows.
TEST_CASE("quantized and 16-bit models: shard_bytes is what a device holds, with head_dim, q/k/v biases and q/k norms",
          "[llama][quantized]") {
  LlamaConfig c{.dim = 64, .hidden_dim = 128, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .head_dim = 32,
                .vocab_size = 64, .seq_len = 8};
  c.qkv_bias = c.qk_norm = true;  // Q = 128, KV = 64
  const TensorWeights f32 = random_weights(c, 9);
  for (const auto& format : {WeightFormat::affine(4, 32), WeightFormat::bf16()}) {
    const model::ConvertedWeights w(f32, format);
    for (int T = 1; T <= 4; ++T) {
      std::vector<int64_t> bytes(T);
      dist::run_on_mesh(dist::Mesh::line(T), [&](dist::Device& dev) {
        bytes[dev.rank()] = model::Llama(w, dev.axis("model")).parameter_bytes();
      });
      const auto plans = model::plan_all_shards(w.config(), T);
      for (int r = 0; r < T; ++r) {
        INFO(format.name() << ", " << T << " devices, device " << r);
        CHECK(bytes[r] == model::shard_bytes(w, plans[r]));
      }
    }
  }
}

TEST_CASE("quantized and 16-bit models: the embedding is split by vocabulary rows, per-device bytes add up to the model",
          "[llama][quantized][embedding]") {
  for (bool shared : {true, false}) {
    const LlamaConfig c = small_config(shared);
    const TensorWeights f32 = random_weights(c, 8);
    const int64_t replicated = (2 * c.n_layers + 1) * c.dim * 4;  // the f32 norms, on every device
    for (const auto& format : {WeightFormat::affine(4, 32), WeightFormat::bf16()}) {
      const model::ConvertedWeights w(f32, format);
      int64_t one = 0;
      for (int T = 1; T <= 4; ++T) {
        std::vector<int64_t> bytes(T);
        dist::run_on_mesh(dist::Mesh::line(T), [&](dist::Device& dev) {
          bytes[dev.rank()] = model::Llama(w, dev.axis("model")).parameter_bytes();
        });
        if (T == 1) one = bytes[0];
        const auto plans = model::plan_all_shards(w.config(), T);  // FFN rows dealt out in whole groups
        int64_t sum = 0, kv_rows = 0;  // KV heads are replicated where devices share them (4 heads, 2 KV)
        for (int r = 0; r < T; ++r) {
          kv_rows += plans[r].kv_rows().count;
          INFO(format.name() << (shared ? ", tied" : ", untied") << ", " << T << " devices, device " << r);
          CHECK(bytes[r] == model::shard_bytes(w, plans[r]));  // what `tpcli inspect` prints
          sum += bytes[r];
        }
        INFO(format.name() << (shared ? ", tied" : ", untied") << ", " << T << " devices");
        const int64_t kv_row_bytes = 2 * model::load_packed_full(w, "layers.0.wk").bytes() / c.kv_dim();  // wk + wv
        CHECK(sum == one + (T - 1) * replicated + (kv_rows - c.kv_dim()) * kv_row_bytes * c.n_layers);
      }
      // the table itself is stored packed (not kept as f32)
      const int64_t table = model::load_packed_full(w, "tok_embeddings").bytes();
      CHECK(table < c.vocab_size * c.dim * 4);
    }
  }
}

TEST_CASE("quantized safetensors round trip keeps the packed words, and the model from the file equals the converted one",
          "[llama][quantized][safetensors]") {
  testing::TempDir dir;
  const TensorWeights f32 = random_weights(small_config(true), 6);
  for (const auto& format : {WeightFormat::affine(4, 64), WeightFormat::mxfp8(), WeightFormat::f16()}) {
    INFO(format.name());
    const model::ConvertedWeights w(f32, format);
    const std::string path = (dir.path() / "q.safetensors").string();
    formats::write_safetensors(path, w);
    const formats::SafetensorsFile file(path);
    CHECK(file.config().quantization.has_value() == format.quantized());
    for (const std::string name : {"tok_embeddings", "layers.1.w2", "layers.0.wk"}) {
      for (const std::string part : {"", ".scales", ".biases"}) {
        const auto a = w.stored(name + part), b = file.stored(name + part);
        if (!a) {  // kept f32 (w2: 160 columns are not whole groups of 64), or no such part
          CHECK((!b || (part.empty() && b->dtype == model::DType::F32)));
          continue;
        }
        REQUIRE(b.has_value());
        CHECK(a->dtype == b->dtype);
        CHECK(a->shape == b->shape);
        const size_t bytes = static_cast<size_t>(tensor::numel(a->shape) * formats::dtype_bytes(a->dtype));
        CHECK(std::memcmp(a->data, b->data, bytes) == 0);
      }
      // get() dequantizes the same values
      const auto ga = w.get(name), gb = file.get(name);
      CHECK(std::vector<float>(ga.begin(), ga.end()) == std::vector<float>(gb.begin(), gb.end()));
    }
    const std::vector<int> prefix = {3, 9, 27};
    const auto a = decode(w, 2, prefix, 6)[0], b = decode(file, 2, prefix, 6)[0];
    CHECK(a.tokens == b.tokens);
    CHECK(a.logits == b.logits);
  }
}

// The packed MoE has no backward to be asked for: the type rules training out. The packed SwiGLU
// trains LoRA adapters on its frozen base (QLoRA: tests/train/test_qlora_train.cpp).
static_assert(std::is_base_of_v<nn::TrainableFeedForward, nn::QuantizedSwiGluFeedForward>);
static_assert(!std::is_base_of_v<nn::TrainableFeedForward, nn::QuantizedMoeFeedForward>);
static_assert(std::is_base_of_v<nn::TrainableFeedForward, nn::SwiGluFeedForward>);
static_assert(std::is_base_of_v<nn::TrainableFeedForward, nn::MoeFeedForward>);

TEST_CASE("quantized model: full training is refused, and a wo split that cuts groups keeps that wo in f32", "[llama][quantized]") {
  const TensorWeights f32 = random_weights(small_config(true), 7);
  const model::ConvertedWeights w(f32, WeightFormat::affine(8, 64));  // heads of 32: pairs of heads per group
  std::string train_error;
  dist::run_on_mesh(dist::Mesh::line(1), [&](dist::Device& dev) {
    model::Llama m(w, dev.axis("model"));
    CHECK_NOTHROW(m.forward(1, 0));
    try {
      model::TrainableLlama trainable(w, dev.axis("model"));
    } catch (const std::invalid_argument& e) {
      train_error = e.what();
    }
  });
  CHECK_THAT(train_error, Catch::Contains("full fine-tuning needs the f32 checkpoint"));
  CHECK(train_error.find('\n') == std::string::npos);
  // 3 devices hold 2/1/1 heads of 32 columns: wo's groups of 64 are cut, those devices keep wo in f32
  const std::vector<int> prefix = {5, 17, 40};
  const auto one = decode(w, 1, prefix, 8)[0];
  const auto three = decode(w, 3, prefix, 8);
  for (int r = 0; r < 3; ++r) {
    CHECK(three[r].tokens == one.tokens);
    CHECK(max_abs_diff(three[r].logits, one.logits) <= 1e-3f * max_abs(one.logits));
  }
  CHECK_THROWS_WITH(model::ConvertedWeights(w, WeightFormat::affine(4, 64)), Catch::Contains("already stored"));
}

TEST_CASE("stories260K quantized at group size 32: same greedy tokens on 1 and 2 devices, near the f32 logits",
          "[llama][quantized][stories260K]") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  TPCLI_REQUIRE_SHARED("data/tok512.bin");
  const formats::Llama2cFile file(testing::shared_path("data/stories260K.bin"));
  const std::vector<int> prefix =
      text::Tokenizer(testing::shared_path("data/tok512.bin"), 512).encode("Once upon a time", true, false);
  const auto f32 = decode(file, 1, prefix, 40)[0];
  for (const auto& format : {WeightFormat::affine(8, 32), WeightFormat::affine(4, 32), WeightFormat::mxfp8()}) {
    const model::ConvertedWeights w(file, format);
    // hidden_dim 172 is not a multiple of 32: w2 stays f32 (as mlx-lm's converter leaves it)
    CHECK(model::stored_format(w, "layers.0.w2") == WeightFormat::f32());
    CHECK(model::stored_format(w, "layers.0.w1") == format);
    const auto one = decode(w, 1, prefix, 40)[0];
    const auto two = decode(w, 2, prefix, 40);
    // the format's rounding, not a wrong layout: logits near f32's (relative RMS difference)
    const double rel = rms_diff(one.logits, f32.logits) / rms_diff(f32.logits, std::vector<float>(f32.logits.size(), 0.0f));
    INFO(format.name() << ": relative RMS logit difference to f32 " << rel);
    for (int r = 0; r < 2; ++r) CHECK(two[r].tokens == one.tokens);
    CHECK(rel < (format.bits == 4 ? 0.2 : format.kind == tensor::WeightKind::Mxfp8 ? 0.25 : 0.02));
    if (format.bits == 8) {  // 8-bit keeps llama2.c's greedy story for a while
      const size_t same = std::mismatch(one.tokens.begin(), one.tokens.end(), f32.tokens.begin()).first - one.tokens.begin();
      INFO("first " << same << " greedy tokens equal f32's");
      CHECK(same >= 10);
    }
  }
}

namespace {

// 4 experts (top 2) of hidden 96 = 3 groups of 32, dim 64: FE is dealt out in whole groups on up
// to 3 tensor-parallel devices.
LlamaConfig moe_config() {
  return LlamaConfig{.dim = 64, .hidden_dim = 96, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .vocab_size = 64,
                     .seq_len = 24, .n_experts = 4, .top_k = 2};
}

// The dequantized path: an f32 model holding the packed model's weights as f32 values.
TensorWeights dequantized(const model::WeightSource& packed) {
  LlamaConfig c = packed.config();
  c.quantization.reset();
  TensorWeights out(c);
  for (const auto& spec : model::llama_parameters(c)) out.set(spec.name, tensor::Tensor(spec.shape, packed.get(spec.name)));
  return out;
}

}  // namespace

TEST_CASE("quantized MoE: packed experts give the dequantized path's tokens on 1..3 devices, with expert parallelism",
          "[llama][quantized][moe]") {
  const TensorWeights f32 = random_weights(moe_config(), 11);
  for (const auto& format : {WeightFormat::affine(8, 32), WeightFormat::affine(4, 32), WeightFormat::mxfp8()}) {
    const model::ConvertedWeights w(f32, format);
    REQUIRE(model::stored_format(w, "layers.0.experts.w2") == format);
    const std::vector<int> prefix = {3, 41, 9, 60};
    const auto ref = decode(dequantized(w), 1, prefix, 10)[0];
    const float scale = max_abs(ref.logits);
    for (auto [G, T] : {std::pair{1, 1}, std::pair{1, 2}, std::pair{1, 3}, std::pair{2, 1}, std::pair{2, 2}, std::pair{4, 1}}) {
      const auto got = decode_on(w, dist::Mesh({{"data", G}, {"model", T}}), prefix, 10);
      for (size_t r = 0; r < got.size(); ++r) {
        INFO(format.name() << ", data (experts) = " << G << ", model = " << T << ", device " << r);
        CHECK(got[r].tokens == ref.tokens);
        CHECK(max_abs_diff(got[r].logits, ref.logits) <= 1e-4f * scale);
      }
    }
  }
}

TEST_CASE("quantized MoE: each device holds its experts packed (bytes as stored, dealt over the expert group)",
          "[llama][quantized][moe]") {
  const LlamaConfig c = moe_config();
  const TensorWeights f32 = random_weights(c, 12);
  const model::ConvertedWeights w(f32, WeightFormat::affine(8, 32));
  int64_t experts_full = 0;  // every layer's experts.w1/w2/w3 as stored (packed words, scales, biases)
  for (int l = 0; l < c.n_layers; ++l)
    for (const char* m : {"w1", "w2", "w3"})
      experts_full += model::load_packed_full(w, "layers." + std::to_string(l) + ".experts." + m).bytes();
  // 8-bit g32: 1 byte per weight + 8 bytes (scale, bias) per 32 = 1.25 of f32's 4 bytes
  CHECK(experts_full * 16 == 3LL * c.n_layers * c.n_experts * c.hidden_dim * c.dim * 4 * 5);
  for (auto [G, T] : {std::pair{1, 1}, std::pair{1, 2}, std::pair{2, 1}, std::pair{2, 2}}) {
    const dist::Mesh mesh({{"data", G}, {"model", T}});
    std::vector<int64_t> bytes(static_cast<size_t>(mesh.size()));
    std::vector<int> data_rank(bytes.size()), model_rank(bytes.size());
    dist::run_on_mesh(mesh, [&](dist::Device& dev) {
      const auto d = static_cast<size_t>(dev.rank());
      bytes[d] = model::Llama(w, dev.axis("model"), dev.axis("data")).parameter_bytes();
      data_rank[d] = dev.axis("data").rank();
      model_rank[d] = dev.axis("model").rank();
    });
    const auto plans = model::plan_all_shards(w.config(), T);
    for (size_t d = 0; d < bytes.size(); ++d) {
      // shard_bytes counts every expert (this device's FE rows, packed); the expert group keeps EL of E
      const int64_t experts_here = experts_full * plans[static_cast<size_t>(model_rank[d])].expert_ffn.count / c.hidden_dim;
      const int64_t EL = nn::local_experts(c.n_experts, G, data_rank[d]).count;
      INFO("data = " << G << ", model = " << T << ", device " << d);
      CHECK(bytes[d] == model::shard_bytes(w, plans[static_cast<size_t>(model_rank[d])]) -
                            experts_here * (c.n_experts - EL) / c.n_experts);
    }
  }
}
