// `tpcli export --to gguf` as a user runs it, checked against files llama.cpp's own converters wrote
// (../shared/reference/gguf): the tokenizer of an exported llama2.c model holds the tokens, scores
// and token types convert-llama2c-to-ggml wrote from the same tok512; a byte-level BPE
// tokenizer.json gives the tokens, merges and pre-tokenizer convert_hf_to_gguf.py wrote; a model
// merged with a LoRA adapter (--fuse), PEFT's folder or llama.cpp's GGUF adapter, gives the logits
// llama.cpp computes applying that adapter itself; bad flags are one line each and leave no file.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "formats/gguf_file.h"
#include "formats/gguf_keys.h"
#include "support/run_tpcli.h"
#include "support/shared_data.h"
#include "support/temp_dir.h"

using namespace tpcli;
using namespace tpcli::testing;
namespace keys = tpcli::formats::gguf_keys;

namespace {

RunResult export_gguf(const std::vector<std::string>& args) {
  std::vector<std::string> all = {"export", "--to", "gguf"};
  all.insert(all.end(), args.begin(), args.end());
  return run_tpcli(all, {.timeout_seconds = 120});
}

void check_same_vocabulary(const formats::gguf::GgufFile& got, const formats::gguf::GgufFile& want) {
  CHECK(got.string(keys::TOKENIZER_MODEL) == want.string(keys::TOKENIZER_MODEL));
  CHECK(got.strings(keys::TOKENS) == want.strings(keys::TOKENS));
  CHECK(got.integers(keys::TOKEN_TYPE) == want.integers(keys::TOKEN_TYPE));
  CHECK(got.numbers(keys::SCORES) == want.numbers(keys::SCORES));
  CHECK(got.strings(keys::MERGES) == want.strings(keys::MERGES));
  CHECK(got.string(keys::TOKENIZER_PRE) == want.string(keys::TOKENIZER_PRE));
  CHECK(got.integer(keys::BOS_ID) == want.integer(keys::BOS_ID));
  CHECK(got.integer(keys::EOS_ID) == want.integer(keys::EOS_ID));
}

std::vector<std::vector<double>> logit_lines(const std::string& text) {
  std::vector<std::vector<double>> rows;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream values(line);
    rows.emplace_back();
    for (double v; values >> v;) rows.back().push_back(v);
  }
  return rows;
}

// A tokenizer.json of the byte-level BPE a GGUF file holds (its control tokens as special added
// tokens), with Qwen2's pre-tokenizer.
std::string tokenizer_json_of(const formats::gguf::GgufFile& gguf) {
  const std::vector<std::string> tokens = *gguf.strings(keys::TOKENS);
  const std::vector<int64_t> types = *gguf.integers(keys::TOKEN_TYPE);
  nlohmann::json vocab = nlohmann::json::object(), added = nlohmann::json::array();
  for (size_t id = 0; id < tokens.size(); ++id) {
    vocab[tokens[id]] = id;
    if (types[id] == static_cast<int64_t>(keys::TokenType::Control))
      added.push_back({{"id", id}, {"content", tokens[id]}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                       {"normalized", false}, {"special", true}});
  }
  const std::string qwen2_split =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  const nlohmann::json j = {
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", qwen2_split}}}, {"behavior", "Isolated"}, {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}}}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}},
      {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"fuse_unk", false}, {"byte_fallback", false},
                 {"vocab", vocab}, {"merges", *gguf.strings(keys::MERGES)}}}};
  return j.dump();
}

}  // namespace

TEST_CASE("gguf export cli: a llama2.c model's tokenizer is what llama.cpp's converter wrote from the same tok512", "[gguf]") {
  require_shared("reference/gguf/stories260K-f32.gguf");
  const TempDir dir;
  const std::string out = (dir.path() / "stories260K.gguf").string();
  const RunResult r = export_gguf({"--model", shared_path("data/stories260K.bin"), "-z", shared_path("data/tok512.bin"), "--dtype", "f32",
                                   "--out", out});
  INFO(r.err);
  REQUIRE(r.code == 0);
  const formats::gguf::GgufFile got(out), want(shared_path("reference/gguf/stories260K-f32.gguf"));
  check_same_vocabulary(got, want);
  CHECK(got.integer(keys::UNKNOWN_ID) == want.integer(keys::UNKNOWN_ID));
  CHECK(got.boolean(keys::ADD_BOS) == true);
  // The weights: every tensor llama.cpp's file has, bit for bit, but the tied classifier's copy.
  for (const formats::gguf::TensorInfo& t : want.tensors()) {
    INFO(t.name);
    const formats::gguf::TensorInfo* mine = got.tensor(t.name);
    if (t.name == "output.weight") {
      CHECK(mine == nullptr);
      continue;
    }
    REQUIRE(mine);
    CHECK(mine->ne == t.ne);
    REQUIRE(mine->data.size() == t.data.size());
    CHECK(std::equal(mine->data.begin(), mine->data.end(), t.data.begin()));
  }
}

TEST_CASE("gguf export cli: a byte-level BPE tokenizer.json becomes gpt2 tokens, merges and its pre-tokenizer's name", "[gguf]") {
  require_shared("reference/gguf/hf-qwen2-f32.gguf");
  const TempDir dir;
  const formats::gguf::GgufFile want(shared_path("reference/gguf/hf-qwen2-f32.gguf"));
  const std::string json = dir.write("tok/tokenizer.json", tokenizer_json_of(want));
  const std::string chat_template = "{% for m in messages %}<|bos|>{{ m['content'] }}<|eos|>{% endfor %}";
  dir.write("tok/tokenizer_config.json", nlohmann::json({{"bos_token", "<|bos|>"}, {"eos_token", "<|eos|>"}, {"pad_token", "<|pad|>"},
                                                         {"add_bos_token", false},
                                                         {"chat_template", chat_template}}).dump());
  const std::string out = (dir.path() / "qwen2.gguf").string();
  const RunResult r = export_gguf({"--model", shared_path("reference/hf-archs/qwen2"), "-z", json, "--dtype", "f32", "--out", out});
  INFO(r.err);
  REQUIRE(r.code == 0);
  const formats::gguf::GgufFile got(out);
  CHECK(got.string(keys::TOKENIZER_PRE) == "qwen2");
  check_same_vocabulary(got, want);
  CHECK(got.boolean(keys::ADD_BOS) == false);  // Qwen2 adds no BOS
  CHECK(got.integer(keys::PADDING_ID) == 0);
  CHECK(got.string(keys::CHAT_TEMPLATE) == chat_template);
}

TEST_CASE("gguf export cli: a model fused with a LoRA adapter, from its PEFT folder or llama.cpp's GGUF file, gives the logits llama.cpp computes with the adapter", "[gguf]") {
  require_shared("reference/gguf/stories260K-lora.logits.txt");
  const TempDir dir;
  std::ifstream tokens_file(shared_path("reference/gguf/stories260K-lora.tokens"));
  std::string tokens;
  std::getline(tokens_file, tokens);
  const auto want = logit_lines(slurp(shared_path("reference/gguf/stories260K-lora.logits.txt")));
  for (const char* adapter : {"stories260K-lora-peft", "stories260K-lora-f32.gguf"}) {
    INFO(adapter);
    const std::string out = (dir.path() / (std::string(adapter) + ".fused.gguf")).string();
    const RunResult r = export_gguf({"--model", shared_path("data/stories260K.bin"), "-z", shared_path("data/tok512.bin"), "--adapter",
                                     shared_path(std::string("reference/gguf/") + adapter), "--fuse", "--dtype", "f32", "--out", out});
    INFO(r.err);
    REQUIRE(r.code == 0);
    const RunResult logits = run_tpcli({"logits", "--model", out, "--tokens", tokens}, {.timeout_seconds = 60});
    REQUIRE(logits.code == 0);
    const auto got = logit_lines(logits.out);
    REQUIRE(got.size() == want.size());
    double worst = 0;
    for (size_t p = 0; p < want.size(); ++p) {
      REQUIRE(got[p].size() == want[p].size());
      for (size_t v = 0; v < want[p].size(); ++v) worst = std::max(worst, std::abs(got[p][v] - want[p][v]));
    }
    CHECK(worst <= 1e-4);  // the README's tolerance for llama.cpp's f32 forward pass
  }
}

TEST_CASE("gguf export cli: bad flags and tokenizers are one line and leave no file", "[gguf]") {
  require_shared("data/hf-tokenizers/llama3/tokenizer.json");
  const TempDir dir;
  const std::string out = (dir.path() / "bad.gguf").string();
  const std::string model = shared_path("data/stories260K.bin"), tok = shared_path("data/tok512.bin");
  const auto one_line_failure = [&](const std::vector<std::string>& args, const std::string& says) {
    const RunResult r = args[0] == "--to" ? run_tpcli([&] {
      std::vector<std::string> all = {"export"};
      all.insert(all.end(), args.begin(), args.end());
      return all;
    }(), {.timeout_seconds = 60})
                                          : export_gguf(args);
    INFO(r.err);
    CHECK(r.code != 0);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK(r.err.find(says) != std::string::npos);
    CHECK(!std::filesystem::exists(out));
  };
  one_line_failure({"--model", model, "-z", tok, "--dtype", "q4_k", "--out", out}, "--dtype q4_k: expected f32, f16, bf16 or q8_0");
  one_line_failure({"--model", model, "--out", out}, "--to gguf needs -z tokenizer.bin or tokenizer.json");
  one_line_failure({"--to", "hf", "--model", model, "-z", tok, "--out", out}, "--tokenizer: only --to gguf writes a tokenizer");
  one_line_failure({"--model", shared_path("reference/hf-archs/qwen2"), "-z", shared_path("data/hf-tokenizers/llama3"), "--out", out},
                   "more than the model's vocab_size 512");
  // Llama 3's RoPE scaling as a GGUF's per-pair factors: config.json has no place for them.
  one_line_failure({"--to", "hf", "--model", shared_path("reference/gguf/hf-llama-f32.gguf"), "--out", out},
                   "Hugging Face directories cannot hold RoPE frequency factors");
  one_line_failure({"--model", model, "-z", shared_path("data/hf-tokenizers/mistral"), "--out", out}, "not byte-level BPE");
  const std::string existing = dir.write("existing.gguf", "keep");
  const RunResult kept = export_gguf({"--model", model, "-z", tok, "--out", existing});
  CHECK(kept.code != 0);
  CHECK(slurp(existing) == "keep");
}
