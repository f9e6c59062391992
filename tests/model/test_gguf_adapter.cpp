// formats/gguf_adapter.h against llama.cpp (../shared/reference/gguf/, "stories260K-lora"): the GGUF
// adapter convert_lora_to_gguf.py wrote, applied unmerged to stories260K-f32.gguf, gives the logits
// llama.cpp computes with it on 1, 2 and 4 devices within the README's 1e-4, and its greedy
// continuation; the PEFT folder it was converted from reads to the same adapter, on a GGUF base and
// on the llama2.c checkpoint. A qwen2 adapter (random, written as the converter writes one: lora_b's
// q/k rows left in rotate-half order) reads as its PEFT folder; random qwen2 and phi3 adapters (phi3's
// on its fused attn_qkv and ffn_up) give the logits of the base file with them merged in its own layout. Files that are no adapter for the model are one-line errors naming the
// file and the key or tensor.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <regex>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "distributed/runtime.h"
#include "formats/gguf_adapter.h"
#include "formats/gguf_model.h"
#include "formats/gguf_writer.h"
#include "formats/open_model.h"
#include "formats/peft_adapter.h"
#include "model/llama.h"
#include "model/lora_adapter.h"
#include "random_lora.h"
#include "support/raw_safetensors.h"
#include "support/error_of.h"
#include "support/shared_data.h"
#include "support/temp_dir.h"
#include "tensor/ggml_blocks.h"

using namespace tpcli;
using tpcli::testing::shared_path;

namespace {

std::string gguf_path(const std::string& name) { return shared_path("reference/gguf/" + name); }
const std::string BASE = "stories260K-f32.gguf", ADAPTER = "stories260K-lora-f32.gguf", PEFT = "stories260K-lora-peft";

std::vector<int> comma_ids(const std::string& path) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  std::replace(text.begin(), text.end(), ',', ' ');
  std::stringstream s(text);
  std::vector<int> ids;
  for (int id; s >> id;) ids.push_back(id);
  return ids;
}

std::vector<float> logits_file(const std::string& path) {
  std::ifstream in(path);
  std::vector<float> out;
  for (float v; in >> v;) out.push_back(v);
  return out;
}

// The model at `base` with the adapter at `adapter` (a GGUF file or a PEFT folder) unmerged.
std::unique_ptr<model::WeightSource> adapted(const std::string& base, const std::string& adapter) {
  formats::OpenedModel opened = formats::open(base);
  model::LoraAdapterSet set = formats::load_adapter(adapter, opened.weights->config());
  return std::make_unique<model::AdaptedWeights>(std::move(opened.weights), std::move(set), adapter);
}

std::vector<float> prefill_on(const model::WeightSource& weights, const std::vector<int>& tokens, int devices) {
  std::vector<float> got;
  dist::run_on_mesh(dist::Mesh::line(devices), [&](dist::Device& dev) {
    std::vector<float> logits = model::Llama(weights, dev.axis("model"), dev.axis("expert")).prefill_logits(tokens, 0);
    if (dev.rank() == 0) got = std::move(logits);
  });
  return got;
}

float max_abs_diff(std::span<const float> a, std::span<const float> b) {
  REQUIRE(a.size() == b.size());
  float diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, std::abs(a[i] - b[i]));
  return diff;
}

// A copy of the reference adapter with its metadata and the tensors `keep` accepts, then `extra`.
std::string edited_adapter(const tpcli::testing::TempDir& tmp, const std::string& name, const std::function<bool(const std::string&)>& keep,
                           std::vector<formats::gguf::TensorToWrite> extra = {}) {
  const formats::gguf::GgufFile file(gguf_path(ADAPTER));
  formats::gguf::GgufWriter w;
  for (const auto& [key, value] : file.metadata())
    if (key != "general.alignment") w.add(key, value);
  for (const formats::gguf::TensorInfo& t : file.tensors()) {
    if (!keep(t.name)) continue;
    w.add_tensor({t.name, t.ne, t.type, [&t] {
                    std::vector<float> v(t.elements());
                    tensor::dequantize_row(t.type, t.data.data(), v.data(), static_cast<int64_t>(v.size()));
                    return v;
                  }});
  }
  for (auto& t : extra) w.add_tensor(std::move(t));
  std::ostringstream out;
  w.write(out);
  return tmp.write(name, out.str());
}

}  // namespace

TEST_CASE("gguf adapter: llama.cpp's LoRA file on its f32 base gives llama.cpp's logits on 1, 2 and 4 devices within 1e-4", "[gguf]") {
  TPCLI_REQUIRE_SHARED("reference/gguf/stories260K-lora.logits.txt");
  const auto weights = adapted(gguf_path(BASE), gguf_path(ADAPTER));
  const model::LoraAdapterSet& set = *weights->adapter();
  CHECK(set.rank == 4);
  CHECK(set.scale() == 2.0f);  // the README: alpha 8 / rank 4
  CHECK(set.tensors.size() == 70);
  const std::vector<int> tokens = comma_ids(gguf_path("stories260K-lora.tokens"));
  const std::vector<float> want = logits_file(gguf_path("stories260K-lora.logits.txt"));
  REQUIRE(want.size() == tokens.size() * static_cast<size_t>(weights->config().vocab_size));
  for (int devices : {1, 2, 4}) {
    const float diff = max_abs_diff(prefill_on(*weights, tokens, devices), want);
    INFO(devices << " devices: max abs diff " << diff);
    CHECK(diff <= 1e-4f);
  }
  // Without the adapter llama.cpp's logits are far off (the README: it moves them by up to 11.8).
  const formats::GgufModel base(gguf_path(BASE));
  CHECK(max_abs_diff(prefill_on(base, tokens, 1), want) > 1.0f);
}

TEST_CASE("gguf adapter: greedy decode token by token with the adapter continues as llama.cpp does", "[gguf]") {
  TPCLI_REQUIRE_SHARED("reference/gguf/stories260K-lora.greedy.txt");
  const auto weights = adapted(gguf_path(BASE), gguf_path(ADAPTER));
  const std::vector<int> prompt = comma_ids(gguf_path("stories260K-lora.tokens")), want = comma_ids(gguf_path("stories260K-lora.greedy.txt"));
  REQUIRE(want.size() == 16);
  std::vector<int> got;
  dist::run_on_mesh(dist::Mesh::line(2), [&](dist::Device& dev) {
    model::Llama m(*weights, dev.axis("model"), dev.axis("expert"));
    std::vector<int> out;
    int next = -1;
    for (size_t p = 0; p < prompt.size(); ++p) next = m.forward_argmax(prompt[p], static_cast<int>(p));
    for (size_t i = 0; i < want.size(); ++i) {
      out.push_back(next);
      next = m.forward_argmax(next, static_cast<int>(prompt.size() + i));
    }
    if (dev.rank() == 0) got = std::move(out);
  });
  CHECK(got == want);
}

TEST_CASE("gguf adapter: the PEFT folder it was converted from is the same adapter, on the GGUF base and on the llama2.c one", "[gguf]") {
  TPCLI_REQUIRE_SHARED("reference/gguf/stories260K-lora-peft/adapter_config.json");
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  const auto from_gguf = adapted(gguf_path(BASE), gguf_path(ADAPTER));
  const auto from_peft = adapted(gguf_path(BASE), gguf_path(PEFT));
  // The same tensors under the same names: lora_b's q/k rows end in one order from both layouts.
  const model::LoraAdapterSet &g = *from_gguf->adapter(), &p = *from_peft->adapter();
  CHECK(g.rank == p.rank);
  CHECK(g.scale() == p.scale());
  CHECK(g.targets == p.targets);
  REQUIRE(g.tensors.size() == p.tensors.size());
  for (const auto& [name, t] : p.tensors) {
    INFO(name);
    REQUIRE(g.tensors.count(name));
    CHECK(g.tensors.at(name).shape() == t.shape());
    CHECK(max_abs_diff(g.tensors.at(name).span(), t.span()) <= 1e-7f);
  }
  const std::vector<int> tokens = comma_ids(gguf_path("stories260K-lora.tokens"));
  const std::vector<float> want = prefill_on(*from_peft, tokens, 1);
  CHECK(max_abs_diff(prefill_on(*from_gguf, tokens, 1), want) <= 1e-5f);
  // The llama2.c checkpoint holds the same weights as the GGUF base, q/k rows in the same order.
  const auto on_llama2c = adapted(shared_path("data/stories260K.bin"), gguf_path(ADAPTER));
  CHECK(max_abs_diff(prefill_on(*on_llama2c, tokens, 2), want) <= 1e-5f);
}

TEST_CASE("gguf adapter: a GGUF that is no adapter for the model is a one-line error naming the file and the key or tensor", "[gguf]") {
  TPCLI_REQUIRE_SHARED("reference/gguf/stories260K-lora-f32.gguf");
  const tpcli::testing::TempDir tmp;
  const formats::GgufModel base(gguf_path(BASE));
  const auto error = [&](const std::string& adapter, const model::LlamaConfig& config) {
    const std::string e = tpcli::testing::error_of<std::runtime_error>([&] { formats::load_adapter(adapter, config); });
    CHECK(e.find('\n') == std::string::npos);
    return e;
  };
  // A model passed as the adapter.
  CHECK_THAT(error(gguf_path(BASE), base.config()),
             Catch::Contains("stories260K-f32.gguf: general.type is missing, not 'adapter': this GGUF is not a LoRA adapter"));
  // A base of other shapes (rand256: dim 256): the first tensor of the file that does not fit.
  const formats::GgufModel rand256(gguf_path("rand256-f16.gguf"));
  CHECK_THAT(error(gguf_path(ADAPTER), rand256.config()),
             Catch::Contains("stories260K-lora-f32.gguf: tensor blk.2.attn_q.weight.lora_a: layer 2 beyond the model's 2"));
  const std::string two_layers =
      edited_adapter(tmp, "two_layers.gguf", [](const std::string& name) { return name.starts_with("blk.0.") || name.starts_with("blk.1."); });
  CHECK_THAT(error(two_layers, rand256.config()),
             Catch::Contains("two_layers.gguf: tensor blk.0.attn_q.weight.lora_a: shape [4, 64], expected [4, 256]") &&
                 Catch::Contains("wrong base model"));
  // A base of another architecture.
  const formats::GgufModel qwen2(gguf_path("hf-qwen2-f32.gguf"));
  CHECK_THAT(error(gguf_path(ADAPTER), qwen2.config()),
             Catch::Contains("stories260K-lora-f32.gguf: general.architecture is 'llama', but the model is qwen2"));
  // A lora_a without its lora_b.
  const std::string no_b = edited_adapter(tmp, "no_b.gguf", [](const std::string& name) { return name != "blk.2.attn_v.weight.lora_b"; });
  CHECK_THAT(error(no_b, base.config()), Catch::Contains("no_b.gguf: tensor blk.2.attn_v.weight.lora_a has no blk.2.attn_v.weight.lora_b beside it"));
  // An adapter on a matrix tpcli does not adapt (llama.cpp allows token_embd).
  const std::string embedding = edited_adapter(tmp, "embedding.gguf", [](const std::string&) { return true; },
                                               {{"token_embd.weight.lora_a", {4, 512}, tensor::GgmlType::F32, [] { return std::vector<float>(2048); }}});
  CHECK_THAT(error(embedding, base.config()), Catch::Contains("embedding.gguf: tensor token_embd.weight.lora_a: not the lora_a / lora_b of a block's"));
  // A non-finite value.
  const std::string nan = edited_adapter(tmp, "nan.gguf", [](const std::string& name) { return name != "blk.4.ffn_down.weight.lora_b"; },
                                         {{"blk.4.ffn_down.weight.lora_b", {4, 64}, tensor::GgmlType::F32, [] {
                                             std::vector<float> v(256);
                                             v[7] = NAN;
                                             return v;
                                           }}});
  CHECK_THAT(error(nan, base.config()), Catch::Contains("nan.gguf: tensor blk.4.ffn_down.weight.lora_b: non-finite value at element 7"));
  // Two pairs on one matrix, their layer spelled two ways.
  const std::string twice = edited_adapter(tmp, "twice.gguf", [](const std::string&) { return true; },
                                           {{"blk.01.attn_v.weight.lora_a", {64, 4}, tensor::GgmlType::F32, [] { return std::vector<float>(256); }},
                                            {"blk.01.attn_v.weight.lora_b", {4, 32}, tensor::GgmlType::F32, [] { return std::vector<float>(128); }}});
  CHECK_THAT(error(twice, base.config()), Catch::Contains("twice.gguf: tensor blk.01.attn_v.weight.lora_a: a second adapter on layer 1's attn_v.weight"));
  // The adapter passed as a model.
  CHECK_THAT(tpcli::testing::error_of<std::runtime_error>([&] { formats::GgufModel model(gguf_path(ADAPTER)); }),
             Catch::Contains("stories260K-lora-f32.gguf: general.type is 'adapter': a LoRA adapter, not a model"));
  // A file that is neither GGUF nor a folder.
  const std::string text = tmp.write("adapter.txt", "not an adapter\n");
  CHECK_THAT(error(text, base.config()), Catch::Contains("adapter.txt: neither a GGUF LoRA adapter"));
}

TEST_CASE("gguf adapter: a qwen2 adapter, its q/k lora_b rows in rotate-half order as convert_lora_to_gguf.py keeps them, reads as its PEFT folder", "[gguf]") {
  TPCLI_REQUIRE_SHARED("reference/gguf/hf-qwen2-f32.gguf");
  const formats::GgufModel qwen2(gguf_path("hf-qwen2-f32.gguf"));
  const model::LlamaConfig& c = qwen2.config();
  std::vector<int> layers(static_cast<size_t>(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) layers[static_cast<size_t>(l)] = l;
  const tpcli::testing::TempDir tmp;
  const std::string peft = (tmp.path() / "peft").string();
  formats::save_peft_adapter(peft, tpcli::testing::random_adapter(c, tpcli::testing::LORA_ALL, layers, 4, 11), c);
  // The converter's renaming (llama.cpp's tensor_mapping), with PEFT's tensors copied as they are:
  // qwen2's rows are not permuted, its RoPE being rotate-half as Hugging Face's.
  const std::map<std::string, std::string> gguf_of = {{"q_proj", "attn_q"},      {"k_proj", "attn_k"}, {"v_proj", "attn_v"},
                                                      {"o_proj", "attn_output"}, {"gate_proj", "ffn_gate"}, {"up_proj", "ffn_up"},
                                                      {"down_proj", "ffn_down"}};
  const tpcli::testing::RawSafetensors raw = tpcli::testing::read_raw(tmp.path() / "peft" / "adapter_model.safetensors");
  formats::gguf::GgufWriter w;
  w.add("general.architecture", formats::gguf::string_value("qwen2"));
  w.add("general.type", formats::gguf::string_value("adapter"));
  w.add("adapter.type", formats::gguf::string_value("lora"));
  w.add("adapter.lora.alpha", formats::gguf::f32_value(8.0f));
  const std::regex peft_name(R"(base_model\.model\.model\.layers\.(\d+)\.\w+\.(\w+)\.lora_(A|B)\.weight)");
  size_t tensors = 0;
  for (const auto& item : raw.header.items()) {
    const std::string name = item.key();
    std::smatch m;
    if (name == "__metadata__") continue;
    REQUIRE(std::regex_match(name, m, peft_name));
    const std::vector<uint64_t> shape = item.value().at("shape").get<std::vector<uint64_t>>();
    w.add_tensor({"blk." + m[1].str() + "." + gguf_of.at(m[2].str()) + ".weight.lora_" + (m[3].str() == "A" ? "a" : "b"),
                  {shape[1], shape[0]}, tensor::GgmlType::F32, [&raw, name] { return raw.f32(name); }});
    ++tensors;
  }
  CHECK(tensors == 14 * static_cast<size_t>(c.n_layers));
  std::ostringstream out;
  w.write(out);
  const std::string gguf = tmp.write("qwen2-lora.gguf", out.str());
  const model::LoraAdapterSet from_gguf = formats::load_adapter(gguf, c), from_peft = formats::load_adapter(peft, c);
  CHECK(from_gguf.scale() == from_peft.scale());
  REQUIRE(from_gguf.tensors.size() == from_peft.tensors.size());
  for (const auto& [name, t] : from_peft.tensors) {
    INFO(name);
    REQUIRE(from_gguf.tensors.count(name));
    CHECK(max_abs_diff(from_gguf.tensors.at(name).span(), t.span()) == 0.0f);
  }
}

namespace {

// A random adapter (seeded) on `tensors` of every block of the GGUF model `base`, laid out as
// convert_lora_to_gguf.py writes one, and `base` with W + alpha/r * B @ A merged into those tensors
// in the file's own layout, in double: the merged model is read with no adapter reader in between.
struct AdapterAndMerged {
  std::string adapter, merged;
};
AdapterAndMerged random_adapter_and_merged(const tpcli::testing::TempDir& tmp, const std::string& base_name,
                                           const std::set<std::string>& tensors, int64_t r, float alpha) {
  namespace gguf = formats::gguf;
  const gguf::GgufFile base(gguf_path(base_name));
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 0.2f);
  gguf::GgufWriter adapter;
  adapter.add("general.architecture", gguf::string_value(*base.string("general.architecture")));
  adapter.add("general.type", gguf::string_value("adapter"));
  adapter.add("adapter.type", gguf::string_value("lora"));
  adapter.add("adapter.lora.alpha", gguf::f32_value(alpha));
  std::map<std::string, std::vector<float>> merged_values;
  const std::regex block_tensor(R"(blk\.\d+\.(\w+)\.weight)");
  for (const gguf::TensorInfo& t : base.tensors()) {
    std::smatch m;
    if (!std::regex_match(t.name, m, block_tensor) || !tensors.count(m[1].str())) continue;
    REQUIRE(t.type == tensor::GgmlType::F32);
    const int64_t IN = static_cast<int64_t>(t.ne[0]), OUT = static_cast<int64_t>(t.ne[1]);
    std::vector<float> a(static_cast<size_t>(r * IN)), b(static_cast<size_t>(OUT * r));
    for (float& x : a) x = normal(rng);
    for (float& x : b) x = normal(rng);
    const auto* w = reinterpret_cast<const float*>(t.data.data());
    std::vector<float>& merged = merged_values[t.name];
    merged.resize(static_cast<size_t>(OUT * IN));
    for (int64_t o = 0; o < OUT; ++o)
      for (int64_t i = 0; i < IN; ++i) {
        double delta = 0;
        for (int64_t k = 0; k < r; ++k) delta += static_cast<double>(b[o * r + k]) * a[k * IN + i];
        merged[o * IN + i] = static_cast<float>(w[o * IN + i] + alpha / r * delta);
      }
    adapter.add_tensor({t.name + ".lora_a", {static_cast<uint64_t>(IN), static_cast<uint64_t>(r)}, tensor::GgmlType::F32, [a] { return a; }});
    adapter.add_tensor({t.name + ".lora_b", {static_cast<uint64_t>(r), static_cast<uint64_t>(OUT)}, tensor::GgmlType::F32, [b] { return b; }});
  }
  REQUIRE(!merged_values.empty());
  gguf::GgufWriter merged;
  for (const auto& [key, value] : base.metadata())
    if (key != "general.alignment") merged.add(key, value);
  for (const gguf::TensorInfo& t : base.tensors())
    merged.add_tensor({t.name, t.ne, tensor::GgmlType::F32, [&t, &merged_values] {
                         if (merged_values.count(t.name)) return merged_values.at(t.name);
                         const auto* w = reinterpret_cast<const float*>(t.data.data());
                         return std::vector<float>(w, w + t.elements());
                       }});
  std::ostringstream adapter_bytes, merged_bytes;
  adapter.write(adapter_bytes);
  merged.write(merged_bytes);
  return {tmp.write(base_name + ".lora.gguf", adapter_bytes.str()), tmp.write(base_name + ".merged.gguf", merged_bytes.str())};
}

}  // namespace

TEST_CASE("gguf adapter: qwen2 and phi3 (fused attn_qkv and gate|up ffn_up) adapters equal their merge into the base file on 1 and 2 devices", "[gguf]") {
  TPCLI_REQUIRE_SHARED("reference/gguf/hf-phi3-f32.gguf");
  const tpcli::testing::TempDir tmp;
  const std::vector<std::pair<std::string, std::set<std::string>>> cases = {
      {"hf-qwen2-f32", {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"}},
      {"hf-phi3-f32", {"attn_qkv", "attn_output", "ffn_up", "ffn_down"}},
  };
  for (const auto& [name, tensors] : cases) {
    INFO(name);
    const auto files = random_adapter_and_merged(tmp, name + ".gguf", tensors, 4, 6.0f);
    const auto weights = adapted(gguf_path(name + ".gguf"), files.adapter);
    CHECK(weights->adapter()->tensors.size() == 14 * static_cast<size_t>(weights->config().n_layers));  // phi3's fused ones split
    const formats::GgufModel merged(files.merged), base(gguf_path(name + ".gguf"));
    const std::vector<int> tokens = comma_ids(gguf_path(name + ".tokens"));
    const std::vector<float> want = prefill_on(merged, tokens, 1);
    CHECK(max_abs_diff(prefill_on(base, tokens, 1), want) > 0.1f);  // the adapter matters
    for (int devices : {1, 2}) {
      const float diff = max_abs_diff(prefill_on(*weights, tokens, devices), want);
      INFO(devices << " devices: max abs diff " << diff);
      CHECK(diff <= 1e-4f);
    }
  }
}
