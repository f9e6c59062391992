// GGUF files through the CLI as a user meets them: `inspect` names the architecture and the tensor
// types with counts, `infer` generates from a k-quant file on 2 devices what it generates on 1, so
// does a file with Llama 3's RoPE scaling as a tensor (rope_freqs), and one whose rope_freqs does
// not fit the heads is one line and a non-zero exit.
// Without -z, a GGUF model runs with the tokenizer it carries (the same text as with tok512.bin);
// one that carries none is a one-line error. `logits` and `infer --ids` with llama.cpp's GGUF LoRA
// adapter give llama.cpp's logits and greedy ids; `inspect` names an adapter file as one; an adapter
// passed as --model and a model as --adapter are one line.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "support/run_tpcli.h"
#include "support/shared_data.h"
#include "support/temp_dir.h"

using namespace tpcli::testing;

TEST_CASE("gguf cli: inspect, infer on 1 and 2 devices, Llama 3's rope_freqs, and one that does not fit") {
  require_shared("reference/gguf/stories260K-q4_k_m.gguf");
  const RunResult inspected = run_tpcli({"inspect", shared_path("reference/gguf/rand256-q4_k_m.gguf")}, {.timeout_seconds = 60});
  INFO(inspected.out << inspected.err);
  REQUIRE(inspected.code == 0);
  CHECK(inspected.out.find("architecture llama, 21 tensors") != std::string::npos);
  CHECK(inspected.out.find("F32 x5 Q4_K x13 Q6_K x3") != std::string::npos);

  for (const std::string file : {"stories260K-q4_k_m.gguf", "hf-llama-q8_0.gguf"}) {
    std::string texts[2];
    for (int devices : {1, 2}) {
      const RunResult r = run_tpcli({"infer", "--model", shared_path("reference/gguf/" + file), "-z", shared_path("data/tok512.bin"),
                                     "--devices", std::to_string(devices), "-t", "0", "-n", "24", "-i", "Once upon a time"},
                                    {.timeout_seconds = 60});
      INFO(file << ": " << r.err);
      REQUIRE(r.code == 0);
      texts[devices - 1] = r.out;
    }
    INFO(file);
    CHECK(texts[0].rfind("Once upon a time", 0) == 0);
    CHECK(texts[0].size() > 24);  // 24 tokens of hf-llama's random weights spell little
    CHECK(texts[0] == texts[1]);
  }

  // hf-llama's rope_freqs.weight cut from 8 factors to 4 (its ne[0], after the name and n_dims).
  std::ifstream in(shared_path("reference/gguf/hf-llama-q8_0.gguf"), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  const size_t name = bytes.find("rope_freqs.weight");
  REQUIRE(name != std::string::npos);
  REQUIRE(bytes[name + 17 + 4] == 8);
  bytes[name + 17 + 4] = 4;
  const TempDir tmp;
  const std::string bad = tmp.write("short-rope-freqs.gguf", bytes);
  const RunResult refused = run_tpcli({"infer", "--model", bad, "-z", shared_path("data/tok512.bin"), "-n", "2"}, {.timeout_seconds = 60});
  CHECK(refused.code != 0);
  CHECK(std::count(refused.err.begin(), refused.err.end(), '\n') == 1);
  CHECK(refused.err.find("short-rope-freqs.gguf: tensor 'rope_freqs.weight' is [4]") != std::string::npos);
}

TEST_CASE("gguf cli: a GGUF model's own tokenizer without -z, in infer and tokenizer encode, and a file without one") {
  require_shared("reference/gguf/stories260K-f32.gguf");
  const std::string model = shared_path("reference/gguf/stories260K-f32.gguf");
  std::string texts[2];
  for (int with_z : {0, 1}) {
    std::vector<std::string> args = {"infer", "--model", model, "-t", "0", "-n", "100", "-i", "Once upon a time"};
    if (with_z) args.insert(args.end(), {"-z", shared_path("data/tok512.bin")});
    const RunResult r = run_tpcli(args, {.timeout_seconds = 60});
    INFO(r.err);
    REQUIRE(r.code == 0);
    texts[with_z] = r.out;
  }
  CHECK(texts[0].rfind("Once upon a time", 0) == 0);
  CHECK(texts[0].size() > 100);
  CHECK(texts[0] == texts[1]);

  // tokenize.tsv's "Hello world" for this file: llama.cpp's ids.
  const RunResult encoded = run_tpcli({"tokenizer", "encode", "--tokenizer", model, "--bos"}, {.input = "Hello world", .timeout_seconds = 60});
  INFO(encoded.err);
  CHECK(encoded.out == "[1,346,306,414,263,304,341]\n");
  // llama.cpp's parse_special = false: tokenize.tsv's row for Phi-3's file, and by default its control
  // tokens parsed out of the text.
  const std::string phi3 = shared_path("reference/gguf/hf-phi3-f32.gguf"), special_text = "<|endoftext|> <s> as plain text";
  const RunResult plain = run_tpcli({"tokenizer", "encode", "--tokenizer", phi3, "--bos", "--no-parse-special"},
                                    {.input = special_text, .timeout_seconds = 60});
  INFO(plain.err);
  CHECK(plain.out == "[1,410,504,506,367,414,431,413,411,444,413,506,505,410,504,419,505,261,419,324,412,271,259,411,444,413]\n");
  const RunResult parsed = run_tpcli({"tokenizer", "encode", "--tokenizer", phi3, "--bos"}, {.input = special_text, .timeout_seconds = 60});
  CHECK(parsed.out.rfind("[1,508,", 0) == 0);
  CHECK(run_tpcli({"tokenizer", "encode", "--tokenizer", shared_path("data/tok512.bin"), "--no-parse-special"}, {.input = "a"}).code == 2);

  // The same model with its tokenizer keys renamed (same lengths: the layout holds).
  std::ifstream in(model, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  for (const std::string key : {"tokenizer.ggml.model", "tokenizer.ggml.tokens"}) {
    const size_t at = bytes.find(key);
    REQUIRE(at != std::string::npos);
    bytes[at + key.size() - 1] = '_';
  }
  const TempDir tmp;
  const std::string bare = tmp.write("bare.gguf", bytes);
  const RunResult refused = run_tpcli({"infer", "--model", bare, "-n", "2"}, {.timeout_seconds = 60});
  CHECK(refused.code != 0);
  CHECK(std::count(refused.err.begin(), refused.err.end(), '\n') == 1);
  CHECK(refused.err.find("bare.gguf: this GGUF file holds no tokenizer") != std::string::npos);
  const RunResult with_z = run_tpcli({"infer", "--model", bare, "-z", shared_path("data/tok512.bin"), "-t", "0", "-n", "100", "-i", "Once upon a time"},
                                     {.timeout_seconds = 60});
  CHECK(with_z.out == texts[1]);
}

TEST_CASE("gguf cli: logits and infer --ids with --adapter FILE.gguf give llama.cpp's logits and greedy ids, inspect names it, and a model and an adapter swapped are refused") {
  require_shared("reference/gguf/stories260K-lora.logits.txt");
  const std::string base = shared_path("reference/gguf/stories260K-f32.gguf"), adapter = shared_path("reference/gguf/stories260K-lora-f32.gguf");
  std::ifstream tokens_file(shared_path("reference/gguf/stories260K-lora.tokens"));
  std::string tokens;
  std::getline(tokens_file, tokens);
  std::istringstream want(slurp(shared_path("reference/gguf/stories260K-lora.logits.txt")));
  for (const char* devices : {"1", "2"}) {
    INFO("devices " << devices);
    const RunResult r = run_tpcli({"logits", "--model", base, "--adapter", adapter, "--tokens", tokens, "--devices", devices}, {.timeout_seconds = 60});
    INFO(r.err);
    REQUIRE(r.code == 0);
    std::istringstream got(r.out);
    want.clear();
    want.seekg(0);
    size_t count = 0;
    double worst = 0;
    for (double g, w; want >> w;) {
      REQUIRE(got >> g);
      worst = std::max(worst, std::abs(g - w));
      ++count;
    }
    CHECK(count == 16 * 512);
    CHECK(worst <= 1e-4);  // the README's tolerance for llama.cpp's f32 forward pass
  }
  // -n 32: the 16 prompt ids, then 16 picked ids fed, and the one picked after the last.
  const RunResult r = run_tpcli({"infer", "--model", base, "--adapter", adapter, "--tokens", tokens, "-t", "0", "-n", "32", "--ids"},
                                {.timeout_seconds = 60});
  INFO(r.err);
  REQUIRE(r.code == 0);
  std::vector<int> greedy;
  std::istringstream greedy_file(slurp(shared_path("reference/gguf/stories260K-lora.greedy.txt")));
  for (std::string id; std::getline(greedy_file, id, ',');) greedy.push_back(std::stoi(id));
  const std::vector<int> got = nlohmann::json::parse(r.out).get<std::vector<int>>();
  REQUIRE(got.size() == 17);
  CHECK(std::vector<int>(got.begin(), got.begin() + 16) == greedy);

  const RunResult inspected = run_tpcli({"inspect", adapter}, {.timeout_seconds = 60});
  INFO(inspected.err);
  CHECK(inspected.code == 0);
  CHECK(inspected.out.find("LoRA adapter (adapter.type lora, alpha 8)") != std::string::npos);
  const RunResult as_model = run_tpcli({"logits", "--model", adapter, "--tokens", tokens}, {.timeout_seconds = 60});
  CHECK(as_model.code != 0);
  CHECK(as_model.err.find("a LoRA adapter, not a model") != std::string::npos);
  const RunResult refused = run_tpcli({"logits", "--model", base, "--adapter", base, "--tokens", tokens}, {.timeout_seconds = 60});
  CHECK(refused.code != 0);
  CHECK(std::count(refused.err.begin(), refused.err.end(), '\n') == 1);
  CHECK(refused.err.find("stories260K-f32.gguf: general.type is missing, not 'adapter'") != std::string::npos);
}
