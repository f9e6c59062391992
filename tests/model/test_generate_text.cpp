// generate_with_tokenizer (engine/generate_text.h) with a small byte-level tokenizer.json written
// here and a scripted model: the prompt is fed forced, generation stops at EOS (not printed), a
// character split over two byte tokens is printed once complete, and TextStream's pieces add up
// to decode_ids of the whole.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "engine/generate_text.h"
#include "support/reference_generate.h"
#include "support/temp_dir.h"
#include "text/hf_pipeline.h"
#include "text/load_tokenizer.h"
#include "text/text_stream.h"

using namespace tpcli::model;
using namespace tpcli::engine;
using namespace tpcli::text;

namespace {

constexpr int BOS = 256, EOS = 257, VOCAB = 260;  // 256 byte tokens, <s>, </s>, two unused ids

// A byte-level BPE with one token per byte (ids 0..255) and no merges, <s>/</s> added.
std::string write_byte_tokenizer(const tpcli::testing::TempDir& dir, bool clean_up = false) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[hf::byte_to_unicode()[static_cast<size_t>(b)]] = b;
  const nlohmann::json file = {
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"added_tokens",
       {{{"id", BOS}, {"content", "<s>"}, {"special", true}}, {{"id", EOS}, {"content", "</s>"}, {"special", true}}}}};
  dir.write("tok/tokenizer.json", file.dump());
  dir.write("tok/tokenizer_config.json", std::string(R"({"bos_token": "<s>", "eos_token": "</s>", )") +
                                             "\"clean_up_tokenization_spaces\": " + (clean_up ? "true" : "false") + "}");
  return (dir.path() / "tok").string();
}

}  // namespace

TEST_CASE("generate_with_tokenizer: prompt forced, stops at EOS, UTF-8 completed before printing") {
  tpcli::testing::TempDir dir;
  const LoadedTokenizer loaded = load_tokenizer(write_byte_tokenizer(dir));
  const TokenizerInterface& tok = *loaded.tokenizer;
  REQUIRE(tok.encode_text("hi", true) == std::vector<int>{BOS, 'h', 'i'});

  // The model "wants" this continuation after the prompt: é as two byte tokens, '!', EOS, 'x'.
  const std::vector<int> script{0xC3, 0xA9, '!', EOS, 'x'};
  std::vector<std::pair<int, int>> fed;  // (token, pos) as the model saw them
  std::vector<float> logits(VOCAB);
  const ForwardFn forward = [&](int token, int pos) -> std::span<const float> {
    fed.emplace_back(token, pos);
    std::fill(logits.begin(), logits.end(), 0.0f);
    const int after_prompt = pos - 2;  // the prompt is 3 tokens: positions 0..2
    logits[static_cast<size_t>(after_prompt >= 0 ? script[static_cast<size_t>(after_prompt)] : 'z')] = 10.0f;
    return logits;
  };
  GenerateOptions options{.prompt = "hi", .steps = 100, .temperature = 0.0f, .seed = 1};
  const GenerateResult r = tokenizer_text(tpcli::testing::reference_run(ModelFns{forward}, VOCAB, options), tok, {EOS}, options.prompt, nullptr);
  CHECK(r.text == "hi\xC3\xA9!\n");
  CHECK(r.tokens == std::vector<int>{BOS, 'h', 'i', 0xC3, 0xA9, '!', EOS});
  CHECK(r.positions == 6);  // EOS is picked, not fed
  CHECK(fed == std::vector<std::pair<int, int>>{{BOS, 0}, {'h', 1}, {'i', 2}, {0xC3, 3}, {0xA9, 4}, {'!', 5}});

  // Without EOS among the stop tokens, the step limit ends it.
  options.steps = 5;
  const GenerateResult limited = tokenizer_text(tpcli::testing::reference_run(ModelFns{forward}, VOCAB, options), tok, {}, options.prompt, nullptr);
  CHECK(limited.positions == 5);
  CHECK(limited.text == "hi\xC3\xA9!\n");  // the last token picked is printed, not fed
}

TEST_CASE("TextStream: the pieces concatenate to decode_ids, never splitting a character") {
  tpcli::testing::TempDir dir;
  const LoadedTokenizer loaded = load_tokenizer(write_byte_tokenizer(dir));
  const std::string text = "a\xF0\x9F\xA6\x99 b\xC3\xA9";  // "a🦙 bé"
  const std::vector<int> ids = loaded.tokenizer->encode_text(text, false);
  REQUIRE(ids.size() == text.size());
  TextStream stream(*loaded.tokenizer, {}, {});
  std::string joined;
  for (int id : ids) {
    const std::string piece = stream.add(id);
    CHECK(piece.find("\xEF\xBF\xBD") == std::string::npos);  // no U+FFFD for a character still arriving
    joined += piece;
  }
  joined += stream.flush();
  CHECK(joined == text);
}

TEST_CASE("TextStream: the clean-up of spaces before punctuation cannot take back a printed space") {
  tpcli::testing::TempDir dir;
  const LoadedTokenizer loaded = load_tokenizer(write_byte_tokenizer(dir, /*clean_up=*/true));
  const std::vector<int> ids = loaded.tokenizer->encode_text("Hi . Bye !", false);
  CHECK(loaded.tokenizer->decode_ids(ids) == "Hi. Bye!");  // transformers' clean_up_tokenization
  TextStream stream(*loaded.tokenizer, {}, {});
  std::string joined;
  for (int id : ids) joined += stream.add(id);
  CHECK(joined + stream.flush() == "Hi . Bye !");  // streamed: the text as the tokens spell it
}
