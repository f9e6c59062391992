// formats/gguf_model.h against llama.cpp (../shared/reference/gguf/): every llama, qwen2 or phi3 file
// the reader supports gives, on 1, 2 and 4 devices, the logits llama.cpp computes in f32 from
// ggml's own dequantization of the same file (NAME.dequant.logits.txt; NAME.logits.txt for f32
// files) within the README's 1e-4, and its greedy continuation token by token. Files it does not
// support yet are one-line errors naming what is missing.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "distributed/runtime.h"
#include "formats/gguf_model.h"
#include "formats/open_model.h"
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

std::vector<float> logits_file(const std::string& path) {
  std::ifstream in(path);
  std::vector<float> out;
  for (float v; in >> v;) out.push_back(v);
  return out;
}

// The cases GgufModel reads so far: the llama architecture without rope_freqs, qwen2 and phi3. The
// LoRA adapter's case is test_gguf_adapter.cpp's.
std::vector<std::string> supported_cases() {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(shared_path("reference/gguf"))) {
    const std::string file = entry.path().filename().string();
    if (!file.ends_with(".gguf") || file.find("lora") != std::string::npos) continue;
    if (file.starts_with("rand256-") || file.starts_with("stories260K-") || file.starts_with("hf-mixtral-") || file.starts_with("hf-qwen2-") ||
        file.starts_with("hf-phi3-"))
      names.push_back(file.substr(0, file.size() - 5));
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_CASE("gguf model: llama.cpp's llama, qwen2 and phi3 files give its f32 logits on 1, 2 and 4 devices within 1e-4", "[gguf]") {
  TPCLI_REQUIRE_SHARED("reference/gguf/cases.tsv");
  const std::vector<std::string> cases = supported_cases();
  CHECK(cases.size() == 28);  // 15 rand256, 4 stories260K, 3 mixtral, 3 qwen2, 3 phi3
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
  CHECK_THROWS_WITH(formats::GgufModel(gguf_path("hf-llama-f32.gguf")), Catch::Contains("tensor 'rope_freqs.weight'"));
  // qwen2's file with general.architecture spelled "qwen9" (same length: the layout holds).
  std::ifstream in(gguf_path("hf-qwen2-f32.gguf"), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  const size_t key = bytes.find("general.architecture");
  REQUIRE(bytes.compare(key + 20 + 4 + 8, 5, "qwen2") == 0);  // key, u32 type, u64 length, value
  bytes[key + 20 + 4 + 8 + 4] = '9';
  const tpcli::testing::TempDir tmp;
  const std::string path = tmp.write("qwen9.gguf", bytes);
  CHECK_THROWS_WITH(formats::GgufModel(path), Catch::Contains("qwen9.gguf: general.architecture 'qwen9' is not supported"));
  // Phi-3's fused q|k|v must hold every part's rows.
  const formats::GgufModel phi3(gguf_path("hf-phi3-q8_0.gguf"));
  CHECK(phi3.config().seq_len == 2047);  // phi3.attention.sliding_window
}
