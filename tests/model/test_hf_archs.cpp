// The published architectures against an independent implementation: for each directory of
// ../shared/reference/hf-archs (random weights in each architecture's own layout, logits from a
// float64 PyTorch forward written from transformers' modeling files), the sharded model's logits
// on 1-4 devices within 1e-4, and its greedy decode equal to the reference's. Then each
// architecture's named loader failures: a missing bias or norm, a fused tensor of the wrong size,
// a missing expert.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "distributed/runtime.h"
#include "formats/dtype.h"
#include "formats/hf_model.h"
#include "formats/llama2c.h"
#include "formats/safetensors.h"
#include "model/llama.h"
#include "model/packed_weights.h"
#include "model/trainable_llama.h"
#include "reference_files.h"
#include "support/temp_dir.h"
#include "tensor/packed_matrix.h"

using namespace tpcli;
using namespace tpcli::testing;
namespace fs = std::filesystem;

namespace {

const char* const ARCHS[] = {"llama", "qwen2", "qwen3", "qwen3-bf16", "phi3", "mixtral", "qwen3_moe"};

std::vector<int> comma_ids(const std::string& path) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  std::replace(text.begin(), text.end(), ',', ' ');
  return parse_ints(text);
}

std::vector<float> reference_logits(const std::string& path) {  // [P, V] row-major
  std::ifstream in(path);
  std::vector<float> out;
  float v;
  while (in >> v) out.push_back(v);
  return out;
}

std::string arch_path(const std::string& name) { return shared_path("reference/hf-archs/" + name); }

// Device 0's prefill logits [P, V] of `tokens` on `mesh` (experts dealt over its "expert" axis).
std::vector<float> prefill_logits_on(const model::WeightSource& w, const dist::Mesh& mesh, const std::vector<int>& tokens) {
  std::vector<float> out;
  dist::run_on_mesh(mesh, [&](dist::Device& dev) {
    std::vector<float> l = model::Llama(w, dev.axis("model"), dev.axis("expert")).prefill_logits(tokens, 0);
    if (dev.rank() == 0) out = std::move(l);
  });
  return out;
}

}  // namespace

TEST_CASE("hf archs: every architecture's logits on 1-4 devices match the independent forward within 1e-4",
          "[hf][archs]") {
  TPCLI_REQUIRE_SHARED("reference/hf-archs/qwen3_moe.logits.txt");
  for (const std::string arch : ARCHS) {
    const formats::HfModelDir dir(arch_path(arch));
    const std::vector<int> tokens = comma_ids(arch_path(arch) + ".tokens.txt");
    const std::vector<float> want = reference_logits(arch_path(arch) + ".logits.txt");
    REQUIRE(want.size() == tokens.size() * static_cast<size_t>(dir.config().vocab_size));
    for (int devices = 1; devices <= 4; ++devices) {
      std::vector<float> got;
      dist::run_on_mesh(dist::Mesh::line(devices), [&](dist::Device& dev) {
        model::Llama m(dir, dev.axis("model"));
        std::vector<float> logits = m.prefill_logits(tokens, 0);
        if (dev.rank() == 0) got = std::move(logits);
      });
      REQUIRE(got.size() == want.size());
      float diff = 0;
      for (size_t i = 0; i < want.size(); ++i) diff = std::max(diff, std::abs(got[i] - want[i]));
      INFO(arch << " on " << devices << " devices: max abs diff " << diff);
      CHECK(diff <= 1e-4f);
    }
  }
}

TEST_CASE("hf archs: greedy decode token by token continues every reference prompt as the reference does",
          "[hf][archs]") {
  TPCLI_REQUIRE_SHARED("reference/hf-archs/qwen3_moe.greedy.txt");
  for (const std::string arch : ARCHS) {
    const formats::HfModelDir dir(arch_path(arch));
    const std::vector<int> prompt = comma_ids(arch_path(arch) + ".tokens.txt"),
                           want = comma_ids(arch_path(arch) + ".greedy.txt");
    for (int devices : {1, 3}) {
      std::vector<int> got;
      dist::run_on_mesh(dist::Mesh::line(devices), [&](dist::Device& dev) {
        model::Llama m(dir, dev.axis("model"));
        std::vector<int> out;
        int next = -1;
        for (size_t p = 0; p < prompt.size(); ++p) next = m.forward_argmax(prompt[p], static_cast<int>(p));
        for (size_t i = 0; i < want.size(); ++i) {
          out.push_back(next);
          next = m.forward_argmax(next, static_cast<int>(prompt.size() + i));
        }
        if (dev.rank() == 0) got = std::move(out);
      });
      INFO(arch << " on " << devices << " devices");
      CHECK(got == want);
    }
  }
}

namespace {

// A copy of a reference directory whose safetensors file is rewritten by `edit` (over its tensors).
fs::path edited_copy(const fs::path& root, const std::string& arch, const std::function<void(std::vector<formats::NamedTensor>&)>& edit,
                     std::vector<std::vector<std::byte>>& keep) {
  const fs::path to = root / arch;
  fs::create_directories(to);
  fs::copy_file(arch_path(arch) + "/config.json", to / "config.json");
  const formats::SafetensorsFile file(arch_path(arch) + "/model.safetensors");
  std::vector<formats::NamedTensor> tensors;
  for (const std::string& name : file.names()) tensors.push_back({name, *file.stored(name)});
  edit(tensors);
  for (auto& t : tensors) {  // the file's map closes with `file`: keep copies of the bytes
    const size_t bytes = static_cast<size_t>(tensor::numel(t.tensor.shape)) * formats::dtype_bytes(t.tensor.dtype);
    keep.emplace_back(static_cast<const std::byte*>(t.tensor.data), static_cast<const std::byte*>(t.tensor.data) + bytes);
    t.tensor.data = keep.back().data();
  }
  formats::write_stored_safetensors((to / "model.safetensors").string(), tensors, {{"format", "pt"}});
  return to;
}

void erase_tensor(std::vector<formats::NamedTensor>& tensors, const std::string& name) {
  const auto it = std::ranges::find_if(tensors, [&](const formats::NamedTensor& t) { return t.name == name; });
  REQUIRE(it != tensors.end());
  tensors.erase(it);
}

std::string open_error(const fs::path& dir) {
  try {
    formats::HfModelDir d(dir.string());
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("hf archs: a missing bias, norm or expert and a fused tensor of the wrong size are one-line errors naming them",
          "[hf][archs][corrupt]") {
  TPCLI_REQUIRE_SHARED("reference/hf-archs/qwen3_moe/model.safetensors");
  TempDir tmp;
  std::vector<std::vector<std::byte>> keep;
  struct Case {
    std::string arch, erased, message;
  };
  const Case cases[] = {
      {"qwen2", "model.layers.1.self_attn.k_proj.bias", "tensor 'model.layers.1.self_attn.k_proj.bias' is missing"},
      {"qwen3", "model.layers.0.self_attn.q_norm.weight", "tensor 'model.layers.0.self_attn.q_norm.weight' is missing"},
      {"mixtral", "model.layers.1.block_sparse_moe.experts.3.w2.weight",
       "tensor 'model.layers.1.block_sparse_moe.experts.3.w2.weight' is missing"},
      {"qwen3_moe", "model.layers.2.mlp.experts.7.up_proj.weight", "tensor 'model.layers.2.mlp.experts.7.up_proj.weight' is missing"},
  };
  for (const Case& c : cases) {
    const fs::path d = edited_copy(tmp.path() / "missing", c.arch, [&](auto& t) { erase_tensor(t, c.erased); }, keep);
    const std::string msg = open_error(d);
    INFO(msg);
    CHECK(msg.rfind((d / "model.safetensors").string() + ":", 0) == 0);
    CHECK(msg.find(c.message) != std::string::npos);
    CHECK(msg.find('\n') == std::string::npos);
  }
  // Phi-3's fused qkv_proj one row short: named with the rows the segments need together
  const fs::path d = edited_copy(tmp.path() / "fused", "phi3", [](auto& tensors) {
    for (auto& t : tensors)
      if (t.name == "model.layers.2.self_attn.qkv_proj.weight") t.tensor.shape[0] -= 1;
  }, keep);
  const std::string msg = open_error(d);
  INFO(msg);
  CHECK(msg.find("'model.layers.2.self_attn.qkv_proj.weight' has shape [127, 64], config.json implies [128, 64] (the fused segments together)") !=
        std::string::npos);
}

TEST_CASE("hf archs: the trainable model's logits on 1-3 devices match the independent forward within 1e-4, "
          "with and without fresh LoRA adapters", "[hf][archs][train]") {
  TPCLI_REQUIRE_SHARED("reference/hf-archs/qwen3_moe.logits.txt");
  for (const std::string arch : ARCHS) {
    const formats::HfModelDir dir(arch_path(arch));
    const std::vector<int> tokens = comma_ids(arch_path(arch) + ".tokens.txt");
    const std::vector<float> want = reference_logits(arch_path(arch) + ".logits.txt");
    const bool sixteen_bit = arch == "qwen3-bf16";  // a packed base: LoRA only (QLoRA)
    for (const bool lora : {false, true}) {
      if (sixteen_bit && !lora) continue;
      for (int devices = 1; devices <= 3; ++devices) {
        std::vector<float> got;
        dist::run_on_mesh(dist::Mesh::line(devices), [&](dist::Device& dev) {
          std::optional<model::LoraOptions> adapters;
          if (lora) adapters = model::LoraOptions{};
          model::TrainableLlama m(dir, dev.axis("model"), {}, adapters);
          std::vector<float> logits = m.forward_logits(tokens, 1, static_cast<int>(tokens.size()));
          if (dev.rank() == 0) got = std::move(logits);
        });
        REQUIRE(got.size() == want.size());
        float diff = 0;
        for (size_t i = 0; i < want.size(); ++i) diff = std::max(diff, std::abs(got[i] - want[i]));
        INFO(arch << (lora ? " with LoRA" : "") << " on " << devices << " devices: max abs diff " << diff);
        CHECK(diff <= 1e-4f);
      }
    }
  }
}

TEST_CASE("hf archs: MoE checkpoints with their experts dealt over an expert axis give the same logits and greedy ids",
          "[hf][archs][moe]") {
  TPCLI_REQUIRE_SHARED("reference/hf-archs/qwen3_moe.greedy.txt");
  for (const std::string arch : {"mixtral", "qwen3_moe"}) {
    const formats::HfModelDir dir(arch_path(arch));
    const std::vector<int> prompt = comma_ids(arch_path(arch) + ".tokens.txt"), want_ids = comma_ids(arch_path(arch) + ".greedy.txt");
    const std::vector<float> want = reference_logits(arch_path(arch) + ".logits.txt");
    // 4 experts over 3 members (mixtral): uneven, as 8 over 3 (qwen3_moe)
    for (auto [E, T] : {std::pair{2, 1}, std::pair{2, 2}, std::pair{3, 1}, std::pair{4, 1}}) {
      const dist::Mesh mesh({{"expert", E}, {"model", T}});
      std::vector<std::vector<float>> logits(static_cast<size_t>(mesh.size()));
      std::vector<std::vector<int>> ids(logits.size());
      dist::run_on_mesh(mesh, [&](dist::Device& dev) {
        model::Llama m(dir, dev.axis("model"), dev.axis("expert"));
        logits[static_cast<size_t>(dev.rank())] = m.prefill_logits(prompt, 0);
        int next = m.forward_argmax(prompt.back(), static_cast<int>(prompt.size()) - 1);  // decode from the filled cache
        for (size_t i = 0; i < want_ids.size(); ++i) {
          ids[static_cast<size_t>(dev.rank())].push_back(next);
          next = m.forward_argmax(next, static_cast<int>(prompt.size() + i));
        }
      });
      for (size_t d = 0; d < logits.size(); ++d) {
        float diff = 0;
        for (size_t i = 0; i < want.size(); ++i) diff = std::max(diff, std::abs(logits[d][i] - want[i]));
        INFO(arch << " on expert=" << E << ", model=" << T << ", device " << d << ": max abs diff " << diff);
        CHECK(diff <= 1e-4f);
        CHECK(ids[d] == want_ids);
      }
    }
  }
}

TEST_CASE("hf archs: export --to hf writes the architecture it read, tensor for tensor the same bytes", "[hf][archs][export]") {
  TPCLI_REQUIRE_SHARED("reference/hf-archs/qwen3_moe/model.safetensors");
  TempDir tmp;
  for (const std::string arch : ARCHS) {
    if (arch == "qwen3-bf16") continue;  // exported in f32 below: the bytes would differ by dtype
    const formats::HfModelDir original(arch_path(arch));
    const fs::path out = tmp.path() / arch;
    formats::write_hf_model(out.string(), original, {.dtype = model::DType::F32});
    const formats::HfModelDir back(out.string());
    INFO(arch);
    CHECK(back.hf_config().architecture == original.hf_config().architecture);
    const formats::SafetensorsFile a(arch_path(arch) + "/model.safetensors"), b((out / "model.safetensors").string());
    REQUIRE(a.names() == b.names());
    for (const std::string& name : a.names()) {
      const model::StoredTensor x = *a.stored(name), y = *b.stored(name);
      INFO(name);
      REQUIRE(x.shape == y.shape);
      CHECK(std::memcmp(x.data, y.data, static_cast<size_t>(tensor::numel(x.shape)) * 4) == 0);
    }
  }
}

TEST_CASE("hf archs: a quantized copy keeps the architecture, and the Llama-only formats refuse what they cannot hold",
          "[hf][archs][export]") {
  TPCLI_REQUIRE_SHARED("reference/hf-archs/qwen2/model.safetensors");
  TempDir tmp;
  const formats::HfModelDir qwen2(arch_path("qwen2"));
  const std::string file = (tmp.path() / "q.safetensors").string();
  formats::write_safetensors(file, model::ConvertedWeights(qwen2, tensor::WeightFormat::affine(8, 32)), {});
  const formats::SafetensorsFile back(file);
  CHECK(back.config().hf_architecture == "Qwen2ForCausalLM");
  CHECK(back.config().qkv_bias);
  // its logits stay near the f32 model's (8-bit weights)
  const std::vector<int> tokens = comma_ids(arch_path("qwen2") + ".tokens.txt");
  const std::vector<float> want = reference_logits(arch_path("qwen2") + ".logits.txt");
  std::vector<float> got;
  dist::run_on_mesh(dist::Mesh::line(2), [&](dist::Device& dev) {
    std::vector<float> l = model::Llama(back, dev.axis("model")).prefill_logits(tokens, 0);
    if (dev.rank() == 0) got = std::move(l);
  });
  float diff = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::abs(got[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  INFO("max abs diff " << diff << " of scale " << scale);
  CHECK(diff <= 0.05f * scale);
  CHECK_THROWS_WITH(formats::write_llama2c((tmp.path() / "m.bin").string(), qwen2),
                    Catch::Contains("llama2.c checkpoints cannot hold a model with q/k/v biases"));
}

namespace {

// The bytes of a stored tensor, q/k rows put back in Hugging Face's rotate_half order.
std::vector<std::byte> hf_row_order(const model::StoredTensor& t, int rope_heads, int head_size) {
  const size_t bytes = static_cast<size_t>(tensor::numel(t.shape)) * formats::dtype_bytes(t.dtype);
  const auto* data = static_cast<const std::byte*>(t.data);
  std::vector<std::byte> out(data, data + bytes);
  if (rope_heads) formats::rope_rows_to_hf(out.data(), data, rope_heads, head_size, bytes / static_cast<size_t>(t.shape[0]));
  return out;
}

// `source` written as mlx-community writes a quantized MoE: every quantized matrix as MODULE.weight
// (U32 words), .scales, .biases, the experts stacked in switch_mlp tensors [E, rows, ...].
// With router_bits, the routers too, quantized from `routers`' values at that many bits (mlx-lm's
// override for MoE gates).
void write_mlx_layout(const fs::path& dir, const model::WeightSource& source, const std::string& architecture,
                      const fs::path& config_from, int bits, int group, int router_bits = 0,
                      const model::WeightSource* routers_from = nullptr) {
  const model::LlamaConfig& c = source.config();
  std::vector<std::vector<std::byte>> keep;
  std::vector<tensor::PackedMatrix> routers;
  std::vector<formats::NamedTensor> tensors;
  nlohmann::json config = nlohmann::json::parse(std::ifstream(config_from));
  config["quantization"] = {{"group_size", group}, {"bits", bits}};
  for (const model::ParamSpec& p : model::llama_parameters(c)) {
    const formats::HfTensorRef ref = formats::hf_tensor_of(p.name, c, architecture);
    const std::string module = ref.modules.size() > 1 ? ref.stacked_module : ref.modules.front();
    if (router_bits && p.name.ends_with(".router")) {
      const tensor::PackedMatrix& m =
          routers.emplace_back(tensor::PackedMatrix::from_f32(routers_from->get(p.name).data(), p.shape[0], p.shape[1],
                                                              tensor::WeightFormat::affine(router_bits, group)));
      const tensor::PackedMatrix::Parts parts = m.parts();
      const int64_t R = p.shape[0], G = p.shape[1] / group;
      tensors.push_back({module + ".weight", {model::DType::U32, {R, p.shape[1] * router_bits / 32}, parts.data}});
      tensors.push_back({module + ".scales", {model::DType::F32, {R, G}, parts.scales}});
      tensors.push_back({module + ".biases", {model::DType::F32, {R, G}, parts.biases}});
      config["quantization"][module] = {{"group_size", group}, {"bits", router_bits}};
      continue;
    }
    for (const std::string suffix : {"", ".scales", ".biases"}) {
      std::optional<model::StoredTensor> t = source.stored(p.name + suffix);
      if (!t && suffix.empty()) t = model::StoredTensor{model::DType::F32, p.shape, source.get(p.name).data()};  // kept in f32
      if (!t) continue;
      keep.push_back(hf_row_order(*t, ref.rope_heads, c.head_size()));
      model::StoredTensor out = *t;
      out.data = keep.back().data();
      if (ref.modules.size() > 1)  // [E, rows, k]: k words, scales or biases per row
        out.shape = {p.shape[0], p.shape[1], tensor::numel(out.shape) / (p.shape[0] * p.shape[1])};
      tensors.push_back({module + (suffix.empty() ? "." + ref.kind : suffix), out});
    }
  }
  fs::create_directories(dir);
  formats::write_stored_safetensors((dir / "model.safetensors").string(), tensors, {{"format", "mlx"}});
  std::ofstream(dir / "config.json") << config.dump(2);
}

}  // namespace

TEST_CASE("hf archs: a Mixtral in mlx-community's quantized layout (experts stacked in switch_mlp) runs as quantized in memory",
          "[hf][archs][moe][quantized]") {
  TPCLI_REQUIRE_SHARED("reference/hf-archs/mixtral/model.safetensors");
  TempDir tmp;
  const formats::HfModelDir f32(arch_path("mixtral"));
  const model::ConvertedWeights quantized(f32, tensor::WeightFormat::affine(8, 32));
  write_mlx_layout(tmp.path() / "mlx", quantized, "MixtralForCausalLM", arch_path("mixtral") + "/config.json", 8, 32);
  const formats::HfModelDir mlx((tmp.path() / "mlx").string());
  const std::vector<int> tokens = comma_ids(arch_path("mixtral") + ".tokens.txt");
  auto logits = [&](const model::WeightSource& w, const dist::Mesh& mesh) { return prefill_logits_on(w, mesh, tokens); };
  const std::vector<float> want = logits(quantized, dist::Mesh::line(1));
  CHECK(logits(mlx, dist::Mesh::line(1)) == want);  // the same packed weights, the same kernels
  for (const dist::Mesh& mesh : {dist::Mesh::line(2), dist::Mesh({{"expert", 2}, {"model", 2}})}) {
    const std::vector<float> got = logits(mlx, mesh);
    float diff = 0;
    for (size_t i = 0; i < want.size(); ++i) diff = std::max(diff, std::abs(got[i] - want[i]));
    INFO(mesh.to_string() << ": max abs diff " << diff);
    CHECK(diff <= 1e-4f);
  }
}

TEST_CASE("hf archs: a Qwen3-MoE in mlx-community's layout with its routers at 8 bits (a quantization override) runs as "
          "the same model in memory", "[hf][archs][moe][quantized]") {
  TPCLI_REQUIRE_SHARED("reference/hf-archs/qwen3_moe/model.safetensors");
  TempDir tmp;
  const formats::HfModelDir f32(arch_path("qwen3_moe"));
  // the same weights in memory: routers through 8-bit and back (as the file's are read), everything else 4-bit
  model::TensorWeights routed(f32.config());
  for (const model::ParamSpec& p : model::llama_parameters(f32.config())) {
    const std::span<const float> v = f32.get(p.name);
    tensor::Tensor t(p.shape, v);
    if (p.name.ends_with(".router"))
      t = tensor::Tensor(p.shape, tensor::PackedMatrix::from_f32(v.data(), p.shape[0], p.shape[1], tensor::WeightFormat::affine(8, 32))
                                      .dequantize()
                                      .span());
    routed.set(p.name, std::move(t));
  }
  const model::ConvertedWeights quantized(routed, tensor::WeightFormat::affine(4, 32));
  write_mlx_layout(tmp.path() / "mlx", quantized, "Qwen3MoeForCausalLM", arch_path("qwen3_moe") + "/config.json", 4, 32, 8, &f32);
  const formats::HfModelDir mlx((tmp.path() / "mlx").string());
  const std::vector<int> tokens = comma_ids(arch_path("qwen3_moe") + ".tokens.txt");
  auto logits = [&](const model::WeightSource& w, const dist::Mesh& mesh) { return prefill_logits_on(w, mesh, tokens); };
  const std::vector<float> want = logits(quantized, dist::Mesh::line(1));
  for (const dist::Mesh& mesh : {dist::Mesh::line(1), dist::Mesh({{"expert", 2}, {"model", 1}}), dist::Mesh({{"expert", 4}, {"model", 1}})}) {
    const std::vector<float> got = logits(mlx, mesh);
    float diff = 0;
    for (size_t i = 0; i < want.size(); ++i) diff = std::max(diff, std::abs(got[i] - want[i]));
    INFO(mesh.to_string() << ": max abs diff " << diff);
    CHECK(diff <= 1e-4f);
  }
}

TEST_CASE("hf archs: f16 and bf16 files in shards read back as the same model, within 16-bit rounding", "[hf][archs][export]") {
  TPCLI_REQUIRE_SHARED("reference/hf-archs/phi3/model.safetensors");
  TempDir tmp;
  for (const std::string arch : {"qwen3", "phi3", "qwen3_moe"})
    for (const model::DType dtype : {model::DType::F16, model::DType::BF16}) {
      // bf16's 8-bit mantissa moves router logits past the reference's 2e-3 gaps: experts change
      if (arch == "qwen3_moe" && dtype == model::DType::BF16) continue;
      const formats::HfModelDir f32(arch_path(arch));
      const fs::path out = tmp.path() / (arch + (dtype == model::DType::F16 ? "-f16" : "-bf16"));
      formats::write_hf_model(out.string(), f32, {.dtype = dtype, .shards = 3});
      REQUIRE(fs::exists(out / "model.safetensors.index.json"));
      const formats::HfModelDir sixteen(out.string());
      const std::vector<int> tokens = comma_ids(arch_path(arch) + ".tokens.txt");
      const std::vector<float> want = reference_logits(arch_path(arch) + ".logits.txt");
      const std::vector<float> got = prefill_logits_on(sixteen, dist::Mesh::line(3), tokens);
      const int64_t V = f32.config().vocab_size;
      for (size_t p = 0; p < tokens.size(); ++p) {  // README's bf16 tolerance: 5% of the position's largest |logit|
        float diff = 0, scale = 0;
        for (int64_t v = 0; v < V; ++v) {
          diff = std::max(diff, std::abs(got[p * V + v] - want[p * V + v]));
          scale = std::max(scale, std::abs(want[p * V + v]));
        }
        INFO(arch << " " << formats::dtype_name(dtype) << " position " << p << ": max abs diff " << diff << " of " << scale);
        CHECK(diff <= 0.05f * scale);
      }
    }
}

TEST_CASE("hf archs: Phi-3's 128k-context rope scaling (longrope) is refused by name", "[hf][archs][corrupt]") {
  TPCLI_REQUIRE_SHARED("reference/hf-archs/phi3/config.json");
  TempDir tmp;
  fs::copy(arch_path("phi3"), tmp.path() / "phi3", fs::copy_options::recursive);
  const fs::path config = tmp.path() / "phi3" / "config.json";
  nlohmann::json j = nlohmann::json::parse(std::ifstream(config));
  j["rope_scaling"] = {{"type", "longrope"}, {"short_factor", {1.0}}, {"long_factor", {1.0}}};
  std::ofstream(config) << j.dump(2);
  const std::string msg = open_error(tmp.path() / "phi3");
  INFO(msg);
  CHECK(msg.rfind(config.string() + ":", 0) == 0);
  CHECK(msg.find("\"longrope\"") != std::string::npos);
  CHECK(msg.find('\n') == std::string::npos);
}
