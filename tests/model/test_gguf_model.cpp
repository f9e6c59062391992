// formats/gguf_model.h against llama.cpp (../shared/reference/gguf/): every llama, qwen2 or phi3 file
// the reader supports gives, on 1, 2 and 4 devices, the logits llama.cpp computes in f32 from
// ggml's own dequantization of the same file (NAME.dequant.logits.txt; NAME.logits.txt for f32
// files) within the README's 1e-4, and its greedy continuation token by token. Files it does not
// support yet are one-line errors naming what is missing. The hf-llama files hold Llama 3's RoPE
// scaling as llama.cpp's rope_freqs.weight: read as frequency factors, kept by a safetensors
// checkpoint and by `export --to gguf`.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "distributed/runtime.h"
#include "formats/gguf_model.h"
#include "formats/gguf_writer.h"
#include "formats/open_model.h"
#include "formats/safetensors.h"
#include "model/llama.h"
#include "support/shared_data.h"
#include "support/temp_dir.h"

using namespace tpcli;
using tpcli::testing::shared_path;

namespace {

std::string gguf_path(const std::string& name) { return shared_path("reference/gguf/" + name); }

std::vector<int> comma_ids(const std::string& path) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  std::replace(text.begin(), text.end(), ',', ' ');
  std::stringstream s(text);
  std::vector<int> ids;
  for (int id; s >> id;) ids.push_back(id);
  return ids;
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

std::vector<float> logits_on(const model::WeightSource& w, int devices, const std::vector<int>& tokens) {
  std::vector<float> got;
  dist::run_on_mesh(dist::Mesh::line(devices), [&](dist::Device& dev) {
    std::vector<float> logits = model::Llama(w, dev.axis("model"), dev.axis("expert")).prefill_logits(tokens, 0);
    if (dev.rank() == 0) got = std::move(logits);
  });
  return got;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  float diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, std::abs(a[i] - b[i]));
  return diff;
}

std::vector<float> logits_file(const std::string& path) {
  std::ifstream in(path);
  std::vector<float> out;
  for (float v; in >> v;) out.push_back(v);
  return out;
}

// The cases GgufModel reads: the llama architecture (with rope_freqs too), qwen2 and phi3. The
// LoRA adapter's case is test_gguf_adapter.cpp's.
std::vector<std::string> supported_cases() {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(shared_path("reference/gguf"))) {
    const std::string file = entry.path().filename().string();
    if (!file.ends_with(".gguf") || file.find("lora") != std::string::npos) continue;
    if (file.starts_with("rand256-") || file.starts_with("stories260K-") || file.starts_with("hf-mixtral-") || file.starts_with("hf-qwen2-") ||
        file.starts_with("hf-phi3-") || file.starts_with("hf-llama-"))
      names.push_back(file.substr(0, file.size() - 5));
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_CASE("gguf model: llama.cpp's llama, qwen2 and phi3 files give its f32 logits on 1, 2 and 4 devices within 1e-4", "[gguf]") {
  TPCLI_REQUIRE_SHARED("reference/gguf/cases.tsv");
  const std::vector<std::string> cases = supported_cases();
  CHECK(cases.size() == 31);  // 15 rand256, 4 stories260K, 3 llama (rope_freqs), 3 mixtral, 3 qwen2, 3 phi3
  for (const std::string& name : cases) {
    const formats::GgufModel model(gguf_path(name + ".gguf"));
    const std::vector<int> tokens = comma_ids(gguf_path(name + ".tokens"));
    const bool f32 = name.ends_with("-f32");
    const std::vector<float> want = logits_file(gguf_path(name + (f32 ? ".logits.txt" : ".dequant.logits.txt")));
    REQUIRE(want.size() == tokens.size() * static_cast<size_t>(model.config().vocab_size));
    for (int devices : {1, 2, 4}) {
      if (model.config().n_kv_heads % devices != 0 && model.config().n_heads % devices != 0) continue;
      std::vector<float> got;
      dist::run_on_mesh(dist::Mesh::line(devices), [&](dist::Device& dev) {
        std::vector<float> logits = model::Llama(model, dev.axis("model"), dev.axis("expert")).prefill_logits(tokens, 0);
        if (dev.rank() == 0) got = std::move(logits);
      });
      REQUIRE(got.size() == want.size());
      float diff = 0;
      for (size_t i = 0; i < want.size(); ++i) diff = std::max(diff, std::abs(got[i] - want[i]));
      INFO(name << " on " << devices << " devices: max abs diff " << diff);
      CHECK(diff <= 1e-4f);
    }
  }
}

TEST_CASE("gguf model: greedy decode token by token continues each file's prompt as llama.cpp does", "[gguf]") {
  TPCLI_REQUIRE_SHARED("reference/gguf/cases.tsv");
  for (const std::string& name : supported_cases()) {
    const formats::OpenedModel opened = formats::open(gguf_path(name + ".gguf"));
    const std::vector<int> prompt = comma_ids(gguf_path(name + ".tokens")), want = comma_ids(gguf_path(name + ".greedy.txt"));
    std::vector<int> got;
    dist::run_on_mesh(dist::Mesh::line(2), [&](dist::Device& dev) {
      model::Llama m(*opened.weights, dev.axis("model"), dev.axis("expert"));
      std::vector<int> out;
      int next = -1;
      for (size_t p = 0; p < prompt.size(); ++p) next = m.forward_argmax(prompt[p], static_cast<int>(p));
      for (size_t i = 0; i < want.size(); ++i) {
        out.push_back(next);
        next = m.forward_argmax(next, static_cast<int>(prompt.size() + i));
      }
      if (dev.rank() == 0) got = std::move(out);
    });
    INFO(name);
    CHECK(got == want);
    if (!name.starts_with("hf-qwen2") && !name.starts_with("hf-phi3")) {  // these name their own ids
      CHECK(opened.bos_token_id == 1);
      CHECK(opened.eos_token_ids == std::vector<int>{2});
    }
  }
}

TEST_CASE("gguf model: an architecture or tensor it does not read yet is a one-line error naming it", "[gguf]") {
  TPCLI_REQUIRE_SHARED("reference/gguf/hf-qwen2-f32.gguf");
  const tpcli::testing::TempDir tmp;
  {  // rope_freqs.weight with 4 factors where the head size 16 needs 8: its ne[0], after the name and n_dims
    std::string bytes = file_bytes(gguf_path("hf-llama-f32.gguf"));
    const size_t name = bytes.find("rope_freqs.weight");
    REQUIRE(name != std::string::npos);
    const size_t ne0 = name + 17 + 4;
    REQUIRE(bytes[ne0] == 8);
    bytes[ne0] = 4;
    const std::string path = tmp.write("short-rope-freqs.gguf", bytes);
    CHECK_THROWS_WITH(formats::GgufModel(path),
                      Catch::Contains("short-rope-freqs.gguf: tensor 'rope_freqs.weight' is [4], the head size 16 needs [8]"));
  }
  // qwen2's file with general.architecture spelled "qwen9" (same length: the layout holds).
  std::string bytes = file_bytes(gguf_path("hf-qwen2-f32.gguf"));
  const size_t key = bytes.find("general.architecture");
  REQUIRE(bytes.compare(key + 20 + 4 + 8, 5, "qwen2") == 0);  // key, u32 type, u64 length, value
  bytes[key + 20 + 4 + 8 + 4] = '9';
  const std::string path = tmp.write("qwen9.gguf", bytes);
  CHECK_THROWS_WITH(formats::GgufModel(path), Catch::Contains("qwen9.gguf: general.architecture 'qwen9' is not supported"));
  // Phi-3's fused q|k|v must hold every part's rows.
  const formats::GgufModel phi3(gguf_path("hf-phi3-q8_0.gguf"));
  CHECK(phi3.config().seq_len == 2047);  // phi3.attention.sliding_window
}

// llama.cpp's converter turned config.json's rope_scaling into the factors; tpcli turns the same
// config.json (../shared/reference/hf-archs/llama, the directory the hf-llama files came from) into
// its llama3 frequencies. Both divide the same unscaled frequency, so the factors agree to float
// rounding, and the model read either way gives the same logits to float rounding.
TEST_CASE("gguf model: rope_freqs.weight holds the factors of tpcli's llama3 scaling of the same config.json", "[gguf]") {
  TPCLI_REQUIRE_SHARED("reference/hf-archs/llama/config.json");
  TPCLI_REQUIRE_SHARED("reference/gguf/hf-llama-f32.gguf");
  const formats::GgufModel gguf(gguf_path("hf-llama-f32.gguf"));
  const formats::OpenedModel hf = formats::open(shared_path("reference/hf-archs/llama"));
  const model::LlamaConfig& c = hf.weights->config();
  REQUIRE(c.rope_scaling.has_value());
  CHECK_FALSE(gguf.config().rope_scaling.has_value());
  const std::vector<float>& stored = gguf.config().rope_freq_factors;
  const std::vector<float> computed = nn::llama3_frequency_factors(c.head_size(), c.rope_theta, *c.rope_scaling);
  REQUIRE(stored.size() == static_cast<size_t>(c.head_size() / 2));
  REQUIRE(computed.size() == stored.size());
  int scaled = 0, equal_bits = 0;
  for (size_t i = 0; i < stored.size(); ++i) {
    INFO("pair " << i << ": llama.cpp " << stored[i] << ", tpcli " << computed[i]);
    CHECK(std::abs(stored[i] - computed[i]) <= 1e-6f * computed[i]);
    scaled += stored[i] != 1.0f;
    equal_bits += stored[i] == computed[i];
  }
  CHECK(scaled > 0);  // original_max_position 64 puts pairs in the scaled bands
  CHECK(stored.back() == c.rope_scaling->factor);  // the longest wavelength: divided by factor exactly
  WARN(equal_bits << " of " << stored.size() << " factors bit-equal to tpcli's");
  const std::vector<int> tokens = comma_ids(gguf_path("hf-llama-f32.tokens"));
  CHECK(max_abs_diff(logits_on(gguf, 1, tokens), logits_on(*hf.weights, 1, tokens)) <= 1e-4f);
}

TEST_CASE("gguf model: a rope_freqs model saved as safetensors and exported as GGUF keeps its factors and logits", "[gguf]") {
  TPCLI_REQUIRE_SHARED("reference/gguf/hf-llama-f32.gguf");
  const formats::GgufModel source(gguf_path("hf-llama-f32.gguf"));
  const std::vector<int> tokens = comma_ids(gguf_path("hf-llama-f32.tokens"));
  const std::vector<float> want = logits_on(source, 2, tokens);
  const tpcli::testing::TempDir tmp;

  const std::string checkpoint = (tmp.path() / "llama3.safetensors").string();
  formats::write_safetensors(checkpoint, source);
  const formats::SafetensorsFile saved(checkpoint);
  CHECK(saved.config().rope_freq_factors == source.config().rope_freq_factors);
  CHECK(logits_on(saved, 2, tokens) == want);

  const std::string exported = (tmp.path() / "llama3.gguf").string();
  formats::GgufExportOptions f32;
  f32.type = tensor::GgmlType::F32;
  formats::write_gguf_model(exported, saved, f32);
  const formats::GgufModel back(exported);
  const formats::gguf::TensorInfo* factors = back.file().tensor("rope_freqs.weight");
  REQUIRE(factors);
  CHECK(factors->type == tensor::GgmlType::F32);
  CHECK(back.config().rope_freq_factors == source.config().rope_freq_factors);
  for (int devices : {1, 2}) CHECK(logits_on(back, devices, tokens) == logits_on(source, devices, tokens));
}

// A Hugging Face model with rope_scaling exported as GGUF: rope_freqs.weight written as llama.cpp's
// converter writes it from that config.json (its hf-llama-f32.gguf), and the file's logits those of
// the directory to float rounding.
TEST_CASE("gguf model: export --to gguf of a llama3-scaled Hugging Face model writes rope_freqs as llama.cpp's converter did", "[gguf]") {
  TPCLI_REQUIRE_SHARED("reference/hf-archs/llama/config.json");
  TPCLI_REQUIRE_SHARED("reference/gguf/hf-llama-f32.gguf");
  const formats::OpenedModel hf = formats::open(shared_path("reference/hf-archs/llama"));
  const tpcli::testing::TempDir tmp;
  const std::string exported = (tmp.path() / "llama3.gguf").string();
  formats::GgufExportOptions f32;
  f32.type = tensor::GgmlType::F32;
  formats::write_gguf_model(exported, *hf.weights, f32);
  const formats::GgufModel back(exported), converted(gguf_path("hf-llama-f32.gguf"));
  REQUIRE(back.config().rope_freq_factors.size() == converted.config().rope_freq_factors.size());
  for (size_t i = 0; i < converted.config().rope_freq_factors.size(); ++i) {
    const float want = converted.config().rope_freq_factors[i], got = back.config().rope_freq_factors[i];
    INFO("pair " << i);
    CHECK(std::abs(got - want) <= 1e-6f * want);
  }
  const std::vector<int> tokens = comma_ids(gguf_path("hf-llama-f32.tokens"));
  for (int devices : {1, 2}) CHECK(max_abs_diff(logits_on(back, devices, tokens), logits_on(*hf.weights, devices, tokens)) <= 1e-4f);
  CHECK(max_abs_diff(logits_on(back, 1, tokens), logits_file(gguf_path("hf-llama-f32.logits.txt"))) <= 1e-4f);
}

namespace {

formats::gguf::Value split_u16(uint64_t v) { return {formats::gguf::ValueType::u16, formats::gguf::ValueType::u32, {v}}; }
formats::gguf::Value split_i32(int64_t v) { return {formats::gguf::ValueType::i32, formats::gguf::ValueType::u32, {v}}; }

// One part of a split set as llama.cpp's gguf-split writes it: the first part has the model's
// metadata, every part split.no (from 0), split.count and split.tensors.count, and its tensors
// (`whole`'s, f32, copied as they are).
void write_split_part(const std::string& path, const formats::gguf::GgufFile& whole, int no, int count, const std::vector<size_t>& tensors) {
  formats::gguf::GgufWriter w;
  if (no == 0)
    for (const auto& [key, value] : whole.metadata())
      if (key != "general.alignment") w.add(key, value);
  w.add("split.no", split_u16(static_cast<uint64_t>(no)));
  w.add("split.count", split_u16(static_cast<uint64_t>(count)));
  w.add("split.tensors.count", split_i32(static_cast<int64_t>(whole.tensors().size())));
  for (const size_t i : tensors) {
    const formats::gguf::TensorInfo& t = whole.tensors()[i];
    REQUIRE(t.type == tensor::GgmlType::F32);
    w.add_tensor({t.name, t.ne, t.type, [&t] {
                    std::vector<float> v(t.elements());
                    std::memcpy(v.data(), t.data.data(), t.bytes);
                    return v;
                  }});
  }
  std::ofstream out(path, std::ios::binary);
  w.write(out);
  REQUIRE(out.good());
}

}  // namespace

TEST_CASE("gguf model: a split set (gguf-split's NAME-0000i-of-0000n.gguf) gives the whole file's logits, a missing or mismatched part is one line", "[gguf]") {
  TPCLI_REQUIRE_SHARED("reference/gguf/hf-llama-f32.gguf");
  const formats::GgufModel whole(gguf_path("hf-llama-f32.gguf"));
  const formats::gguf::GgufFile& file = whole.file();
  const size_t n = file.tensors().size();
  const tpcli::testing::TempDir tmp;
  const auto part_path = [&](const std::string& set, int i, int count) {
    char suffix[32];
    std::snprintf(suffix, sizeof suffix, "-%05d-of-%05d.gguf", i, count);
    return (tmp.path() / (set + suffix)).string();
  };
  std::vector<std::vector<size_t>> thirds(3);
  for (size_t i = 0; i < n; ++i) thirds[i * 3 / n].push_back(i);
  // `count_of_part_2` and `extra_in_part_3` make the faulty sets: a part's split.count, a tensor given twice.
  const auto write_set = [&](const std::string& set, int parts_written, int count_of_part_2, std::optional<size_t> extra_in_part_3) {
    for (int p = 0; p < parts_written; ++p) {
      std::vector<size_t> tensors = thirds[static_cast<size_t>(p)];
      if (p == 2 && extra_in_part_3) tensors.push_back(*extra_in_part_3);
      write_split_part(part_path(set, p + 1, 3), file, p, p == 1 ? count_of_part_2 : 3, tensors);
    }
    return part_path(set, 1, 3);
  };

  const formats::OpenedModel split = formats::open(write_set("llama", 3, 3, std::nullopt));
  const auto& split_file = dynamic_cast<const formats::GgufModel&>(*split.weights).file();
  CHECK(split_file.tensors().size() == n);
  CHECK(split_file.other_parts().size() == 2);
  CHECK(split.weights->config().rope_freq_factors == whole.config().rope_freq_factors);
  const std::vector<int> tokens = comma_ids(gguf_path("hf-llama-f32.tokens"));
  for (int devices : {1, 2}) CHECK(logits_on(*split.weights, devices, tokens) == logits_on(whole, devices, tokens));

  const auto one_line_error = [](const std::string& path) {
    try {
      formats::GgufModel m(path);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string missing = one_line_error(write_set("gone", 2, 3, std::nullopt));
  CHECK(missing.find("split part 3 of 3, " + part_path("gone", 3, 3) + ", is missing") != std::string::npos);
  const std::string count = one_line_error(write_set("count", 3, 2, std::nullopt));
  CHECK(count.find(part_path("count", 2, 3) + ": metadata 'split.count' is 2, the first part's is 3") != std::string::npos);
  const std::string twice = one_line_error(write_set("twice", 3, 3, thirds[1].front()));
  CHECK(twice.find(part_path("twice", 3, 3) + ": tensor '" + file.tensors()[thirds[1].front()].name + "' is also in " + part_path("twice", 2, 3)) !=
        std::string::npos);
  CHECK(one_line_error(part_path("llama", 2, 3)).find("metadata 'split.no' is 1: open a split set by its first part") != std::string::npos);
  for (const std::string& e : {missing, count, twice}) CHECK(e.find('\n') == std::string::npos);
}
