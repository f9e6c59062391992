// token_bytes against the tokenizers' own decoders: every ordinary token's bytes, decoded after an
// ordinary token (so no leading-space rule applies), are what decode_ids gives; special tokens are
// "", added ones that are not special ("<tool_call>") their text, as decode_ids writes it; and the bytes of an encoded text's tokens, joined, give the text back (split UTF-8
// characters included).
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "support/shared_data.h"
#include "text/hf_tokenizer.h"
#include "text/load_tokenizer.h"
#include "text/token_bytes.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

using namespace tpcli::text;

namespace {

void check_tokenizer(const std::string& relative, int expected_empty_at_least, int expected_added_text = 0) {
  TPCLI_REQUIRE_SHARED(relative);
  const LoadedTokenizer loaded = load_tokenizer(tpcli::testing::shared_path(relative));
  const TokenizerInterface& tok = *loaded.tokenizer;
  const std::vector<std::string> bytes = token_bytes(tok);
  REQUIRE(bytes.size() == static_cast<size_t>(tok.vocab_size()));
  const auto* hf = dynamic_cast<const HfTokenizer*>(&tok);
  const int anchor = tok.encode_text("a", false).back();
  const std::string anchor_text = tok.decode_ids(std::vector<int>{anchor}, false);
  int empty = 0, compared = 0, partial = 0, added_text = 0;
  for (int id = 0; id < tok.vocab_size(); ++id) {
    const std::string& b = bytes[static_cast<size_t>(id)];
    INFO(relative << " token " << id << " '" << tok.token_text(id) << "'");
    if (b.empty()) {
      ++empty;
      if (hf) CHECK(hf->is_special_token(id));
      continue;
    }
    if (hf) CHECK_FALSE(hf->is_special_token(id));
    if (hf && hf->is_added_token(id)) ++added_text;
    if (!utf8::is_valid(b) || b.find('\0') != std::string::npos) {  // run.c's decode stops at a NUL
      ++partial;
      continue;
    }
    const std::string decoded = tok.decode_ids(std::vector<int>{anchor, id}, false);
    REQUIRE(decoded == anchor_text + b);
    ++compared;
  }
  CHECK(empty >= expected_empty_at_least);
  CHECK(added_text == expected_added_text);
  CHECK(compared > tok.vocab_size() / 2);
  CHECK(partial > 0);  // byte tokens / pieces of characters exist in every vocabulary here
  // Joined bytes give an encoded text back, characters split over tokens included.
  const std::string text = "Caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\x98\x80\xF0\x9F\xA6\x99 {\"k\": [1, 2.5e3]}\n\tend";
  const std::vector<int> ids = tok.encode_text(text, false);
  std::string joined;
  for (const int id : ids) joined += bytes[static_cast<size_t>(id)];
  if (joined.size() == text.size() + 1 && joined[0] == ' ') joined.erase(0, 1);  // SentencePiece's dummy prefix
  CHECK(joined == text);
}

}  // namespace

TEST_CASE("token_bytes: Qwen3's byte-level BPE matches its decoder, special tokens are empty, <tool_call> and <think> their text") {
  check_tokenizer("data/hf-tokenizers/qwen3", 14, 12);
  const LoadedTokenizer loaded = load_tokenizer(tpcli::testing::shared_path("data/hf-tokenizers/qwen3"));
  const std::vector<std::string> bytes = token_bytes(*loaded.tokenizer);
  CHECK(bytes[static_cast<size_t>(*loaded.tokenizer->token_id("<tool_call>"))] == "<tool_call>");
  CHECK(bytes[static_cast<size_t>(*loaded.tokenizer->token_id("</think>"))] == "</think>");
  CHECK(bytes[static_cast<size_t>(*loaded.tokenizer->token_id("<|im_end|>"))].empty());
}

TEST_CASE("token_bytes: Llama 3's byte-level BPE matches its decoder, added tokens (all special) are empty") {
  check_tokenizer("data/hf-tokenizers/llama3", 200);
}

TEST_CASE("token_bytes: Mistral's SentencePiece-style BPE (byte fallback) matches its decoder") {
  check_tokenizer("data/hf-tokenizers/mistral", 3);
}

TEST_CASE("token_bytes: llama2.c's tokenizer.bin matches its decoder, <unk> <s> </s> are empty") {
  check_tokenizer("data/tokenizer.bin", 3);
}
