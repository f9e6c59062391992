// text/gguf_tokenizer.h (through formats/gguf_vocabulary.h) against llama.cpp: every text of
// ../shared/reference/gguf/tokenize.tsv, with each of its three tokenizers (SentencePiece tok512, the
// same with Phi-3's control tokens, byte-level BPE with the qwen2 pre-tokenizer), gives the ids
// llama.cpp gave (add_special true, parse_special false), and decodes back to the text. Synthetic
// files pin the rules the references do not reach: user-defined tokens are matched in plain text,
// control tokens only when asked, merges and BOS as the keys say; a bad pre-tokenizer, model or a
// file without a tokenizer is a one-line error naming the file and key.
#include <catch2/catch.hpp>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "engine/end_of_generation.h"
#include "formats/gguf_vocabulary.h"
#include "support/gguf_writer.h"
#include "support/shared_data.h"
#include "support/temp_dir.h"
#include "text/gguf_tokenizer.h"

using namespace tpcli;
using tpcli::testing::GgufWriter;
using tpcli::testing::shared_path;

namespace {

struct TokenizeCase {
  std::string file, text;
  std::vector<int> ids;
};

// tokenize.tsv: file, the text as a JSON string, llama.cpp's ids comma-separated.
std::vector<TokenizeCase> tokenize_cases() {
  std::ifstream in(shared_path("reference/gguf/tokenize.tsv"));
  std::vector<TokenizeCase> cases;
  std::string line;
  std::getline(in, line);  // the header
  while (std::getline(in, line)) {
    std::stringstream fields(line);
    std::string file, text, ids;
    std::getline(fields, file, '\t');
    std::getline(fields, text, '\t');
    std::getline(fields, ids, '\t');
    TokenizeCase c{file, nlohmann::json::parse(text).get<std::string>(), {}};
    std::stringstream numbers(ids);
    for (std::string id; std::getline(numbers, id, ',');) c.ids.push_back(std::stoi(id));
    cases.push_back(std::move(c));
  }
  return cases;
}

const text::GgufTokenizer& as_gguf(const text::LoadedTokenizer& loaded) {
  const auto* gguf = dynamic_cast<const text::GgufTokenizer*>(loaded.tokenizer.get());
  REQUIRE(gguf != nullptr);
  return *gguf;
}

// A byte-level BPE vocabulary small enough to follow by hand: "ab" and "Ġab" merge, "ba" is a
// control token, "bb" a user-defined one, "<|im_end|>" spelled like an end of turn.
GgufWriter tiny_bpe(const std::string& pre, const std::vector<std::string>& merges = {"a b", "\xC4\xA0 ab"}) {
  GgufWriter w;
  w.string("general.architecture", "llama")
      .string("tokenizer.ggml.model", "gpt2")
      .string("tokenizer.ggml.pre", pre)
      .strings("tokenizer.ggml.tokens", {"a", "b", "\xC4\xA0", "ab", "\xC4\xA0" "ab", "ba", "bb", "<eos>", "<|im_end|>"})
      .i32s("tokenizer.ggml.token_type", {1, 1, 1, 1, 1, 3, 4, 3, 1})
      .strings("tokenizer.ggml.merges", merges)
      .u32("tokenizer.ggml.eos_token_id", 7);
  return w;
}

// The one-line error loading `bytes` as a GGUF tokenizer gives.
std::string load_error(const std::string& bytes, const std::string& name) {
  const tpcli::testing::TempDir tmp;
  const std::string path = tmp.write(name, bytes);
  try {
    formats::load_gguf_tokenizer(path);
  } catch (const std::runtime_error& e) {
    const std::string message = e.what();
    CHECK(message.rfind(path + ": ", 0) == 0);
    CHECK(message.find('\n') == std::string::npos);
    return message;
  }
  FAIL("no error");
  return "";
}

}  // namespace

TEST_CASE("gguf tokenizer: every text of tokenize.tsv gives llama.cpp's ids with each of its three tokenizers", "[gguf]") {
  TPCLI_REQUIRE_SHARED("reference/gguf/tokenize.tsv");
  const std::vector<TokenizeCase> cases = tokenize_cases();
  REQUIRE(cases.size() == 120);
  std::map<std::string, text::LoadedTokenizer> loaded;
  for (const TokenizeCase& c : cases) {
    INFO(c.file << " " << nlohmann::json(c.text).dump());
    auto it = loaded.find(c.file);
    if (it == loaded.end()) it = loaded.emplace(c.file, formats::load_gguf_tokenizer(shared_path("reference/gguf/" + c.file))).first;
    const text::GgufTokenizer& tokenizer = as_gguf(it->second);
    CHECK(tokenizer.encode(c.text, /*add_special=*/true, /*parse_special=*/false) == c.ids);
  }
  CHECK(loaded.size() == 3);
}

TEST_CASE("gguf tokenizer: decode gives back every text of tokenize.tsv as llama.cpp does, with and without the BOS", "[gguf]") {
  TPCLI_REQUIRE_SHARED("reference/gguf/tokenize.tsv");
  std::map<std::string, text::LoadedTokenizer> loaded;
  for (const TokenizeCase& c : tokenize_cases()) {
    INFO(c.file << " " << nlohmann::json(c.text).dump());
    auto it = loaded.find(c.file);
    if (it == loaded.end()) it = loaded.emplace(c.file, formats::load_gguf_tokenizer(shared_path("reference/gguf/" + c.file))).first;
    const text::GgufTokenizer& tokenizer = as_gguf(it->second);
    // llama_detokenize(remove_special = true, unparse_special = false) of the ids without BOS: the
    // text, SentencePiece's leading space taken off again.
    CHECK(tokenizer.decode(tokenizer.encode(c.text, false, false), true, false, true) == c.text);
    // With the BOS it added, llama.cpp drops the BOS but keeps that space (only a first token's is
    // taken off); qwen2's adds no BOS and no space.
    const bool sentencepiece_bos = c.ids.front() == tokenizer.bos_id();
    CHECK(tokenizer.decode(c.ids, true, false, true) == (sentencepiece_bos ? " " : "") + c.text);
  }
}

TEST_CASE("gguf tokenizer: the files' special ids, end-of-generation tokens and chat-side interface", "[gguf]") {
  TPCLI_REQUIRE_SHARED("reference/gguf/hf-phi3-f32.gguf");
  const text::LoadedTokenizer phi3 = formats::load_gguf_tokenizer(shared_path("reference/gguf/hf-phi3-f32.gguf"));
  const text::GgufTokenizer& t = as_gguf(phi3);
  CHECK(t.vocab_size() == 512);
  CHECK(t.bos_text() == "<s>");
  CHECK(t.eos_text() == "</s>");
  // Phi-3's <|end|> and <|endoftext|> end generation by their text; </s> as the eos.
  CHECK(t.end_of_generation_ids() == std::vector<int>{508, 510, 2});
  // encode_text parses special tokens (a rendered chat prompt): <|user|> is one token, and Phi-3's
  // special tokens drop the spaces after them.
  std::vector<int> user_hi = {1, 511};
  for (int id : t.encode("Hi", false, false)) user_hi.push_back(id);  // " Hi": the space a span after a special token gets
  CHECK(t.encode_text("<|user|> Hi", true) == user_hi);
  CHECK(t.encode_text("<|user|>   Hi", true) == user_hi);
  CHECK(t.encode("<|user|> Hi", true, false) != user_hi);
  CHECK(t.decode_ids(user_hi) == "<s><|user|> Hi");

  const text::LoadedTokenizer qwen2 = formats::load_gguf_tokenizer(shared_path("reference/gguf/hf-qwen2-f32.gguf"));
  CHECK(as_gguf(qwen2).bos_id() == 1);
  CHECK(as_gguf(qwen2).encode("Hello", true, false) == as_gguf(qwen2).encode("Hello", false, false));  // qwen2 adds no BOS
}

TEST_CASE("gguf tokenizer: user-defined tokens match in plain text, control tokens only when asked", "[gguf]") {
  const tpcli::testing::TempDir tmp;
  const text::LoadedTokenizer loaded = formats::load_gguf_tokenizer(tmp.write("tiny.gguf", tiny_bpe("gpt-2").bytes()));
  const text::GgufTokenizer& t = as_gguf(loaded);
  CHECK(t.encode("ab ab", false, false) == std::vector<int>{3, 4});   // "ab", "Ġab": merged by rank
  CHECK(t.encode("abba", false, false) == std::vector<int>{0, 6, 0});  // "bb" is user-defined
  CHECK(t.encode("aba", false, false) == std::vector<int>{3, 0});      // the control "ba" is text...
  CHECK(t.encode("aba", false, true) == std::vector<int>{0, 5});       // ...unless special tokens are parsed
  CHECK(t.encode("ab", true, false) == std::vector<int>{3});           // gpt-2 adds no BOS
  CHECK(t.is_control(8));                                              // spelled like an end of turn
  CHECK(t.end_of_generation_ids() == std::vector<int>{8, 7});
  CHECK(t.decode(std::vector<int>{3, 4, 5}, false, false, false) == "ab ab");
  CHECK(t.decode(std::vector<int>{3, 4, 5}, false, true, false) == "ab abba");
  // Generation stops at them (engine/end_of_generation.h), and the file's chat template renders chats.
  CHECK(engine::end_of_generation(t, {}).ids == std::vector<int>{8, 7});
  CHECK(!loaded.chat_template);
  GgufWriter with_template = tiny_bpe("gpt-2");
  with_template.string("tokenizer.chat_template", "{{ messages[0]['content'] }}");
  CHECK(formats::load_gguf_tokenizer(tmp.write("chat.gguf", with_template.bytes())).chat_template == "{{ messages[0]['content'] }}");

  GgufWriter with_bos = tiny_bpe("llama-bpe");  // Llama 3's: BOS by default, words that are tokens kept whole
  with_bos.u32("tokenizer.ggml.bos_token_id", 7);
  const text::LoadedTokenizer llama3 = formats::load_gguf_tokenizer(tmp.write("llama3.gguf", with_bos.bytes()));
  CHECK(as_gguf(llama3).encode("ab", true, false) == std::vector<int>{7, 3});
  with_bos.boolean("tokenizer.ggml.add_bos_token", false);
  const text::LoadedTokenizer no_bos = formats::load_gguf_tokenizer(tmp.write("no_bos.gguf", with_bos.bytes()));
  CHECK(as_gguf(no_bos).encode("ab", true, false) == std::vector<int>{3});
}

TEST_CASE("gguf tokenizer: every pre-tokenizer llama.cpp names compiles, and its pieces cover the text", "[gguf]") {
  // GPT-2's 256 byte symbols as the whole vocabulary, no merges: every text encodes byte by byte
  // within each piece, so decoding gives the text back exactly when the pieces cover it.
  std::vector<std::string> symbols;
  for (int b = 0; b < 256; ++b) symbols.push_back(text::hf::byte_to_unicode()[static_cast<size_t>(b)]);
  const std::string sample = "Hello, World! DON'T it's 12345 3.14 \t tabs\n\nnew  lines \u00e9t\u00e9 \u65e5\u672c\u8a9e \U0001F600 $x+y^2|z~`q`";
  const tpcli::testing::TempDir tmp;
  for (const char* pre : {"default", "gpt-2", "llama-bpe", "llama3", "qwen2", "deepseek-llm", "deepseek-coder", "deepseek-v3", "falcon",
                          "starcoder", "refact", "command-r", "smollm", "codeshell", "tekken", "gpt-4o", "smaug-bpe", "olmo", "dbrx",
                          "stablelm2", "mpt", "poro-chat", "bloom", "viking", "chameleon", "chatglm-bpe", "jais", "exaone"}) {
    INFO(pre);
    GgufWriter w;
    w.string("tokenizer.ggml.model", "gpt2").string("tokenizer.ggml.pre", pre).strings("tokenizer.ggml.tokens", symbols)
        .strings("tokenizer.ggml.merges", {});
    const text::LoadedTokenizer loaded = formats::load_gguf_tokenizer(tmp.write("bytes.gguf", w.bytes()));
    const std::vector<int> ids = as_gguf(loaded).encode(sample, false, false);
    CHECK(ids.size() == sample.size());
    CHECK(as_gguf(loaded).decode(ids, false, false, false) == sample);
  }
}

TEST_CASE("gguf tokenizer: an unknown pre-tokenizer or model, or no tokenizer at all, is a one-line error naming the key", "[gguf]") {
  const std::string pre = load_error(tiny_bpe("no-such-pre").bytes(), "pre.gguf");
  CHECK(pre.find("tokenizer.ggml.pre") != std::string::npos);
  CHECK(pre.find("no-such-pre") != std::string::npos);

  GgufWriter bert;
  bert.string("tokenizer.ggml.model", "bert").strings("tokenizer.ggml.tokens", {"a"});
  const std::string model = load_error(bert.bytes(), "bert.gguf");
  CHECK(model.find("tokenizer.ggml.model") != std::string::npos);
  CHECK(model.find("bert") != std::string::npos);

  GgufWriter none;
  none.string("general.architecture", "llama");
  CHECK(load_error(none.bytes(), "none.gguf").find("holds no tokenizer") != std::string::npos);

  const std::string merge = load_error(tiny_bpe("gpt-2", {"a b", "ab"}).bytes(), "merge.gguf");
  CHECK(merge.find("tokenizer.ggml.merges[1]") != std::string::npos);
  GgufWriter no_merges;
  no_merges.string("tokenizer.ggml.model", "gpt2").strings("tokenizer.ggml.tokens", {"a"});
  CHECK(load_error(no_merges.bytes(), "no_merges.gguf").find("tokenizer.ggml.merges: missing") != std::string::npos);
}
