// tokenizer.json tokenizers and chat templates vs Hugging Face: every line of
// ../shared/reference/hf-tokenizers/*.jsonl (ids made by transformers.js and checked by a second
// implementation; chats rendered by jinja2 as transformers configures it) must be reproduced:
// encode, decode, and the chat template's rendering and ids.
#include <catch2/catch.hpp>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/chat_template.h"
#include "model/hf_tokenizer.h"
#include "model/load_tokenizer.h"
#include "reference_files.h"

using namespace tpcli::model;
using tpcli::testing::shared_path;

namespace {

std::vector<nlohmann::json> reference_lines(const std::string& name) {
  std::ifstream in(shared_path("reference/hf-tokenizers/" + name + ".jsonl"));
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

std::vector<ChatMessage> messages_of(const nlohmann::json& chat) {
  std::vector<ChatMessage> messages;
  for (const auto& m : chat) messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  return messages;
}

// Checks every reference line of `name`; returns how many lines were checked.
size_t check_reference(const std::string& name) {
  const LoadedTokenizer loaded = load_tokenizer(shared_path("data/hf-tokenizers/" + name));
  const TokenizerInterface& tokenizer = *loaded.tokenizer;
  size_t checked = 0;
  for (const nlohmann::json& line : reference_lines(name)) {
    const std::string text = line["text"].get<std::string>();
    const std::vector<int> expected = line["ids"].get<std::vector<int>>();
    INFO(name << " line " << checked + 1 << ": " << line.dump().substr(0, 300));
    if (line.contains("chat")) {
      REQUIRE(loaded.chat_template.has_value());
      const ChatTemplate chat_template = recognise_chat_template(*loaded.chat_template);
      const ChatTokens tokens{tokenizer.bos_text(), tokenizer.eos_text()};
      CHECK(render_chat(chat_template, messages_of(line["chat"]), tokens, true) == text);
    }
    CHECK(tokenizer.encode_text(text, /*bos=*/false) == expected);
    const std::string decoded = line.contains("decoded") ? line["decoded"].get<std::string>() : text;
    CHECK(tokenizer.decode_ids(expected) == decoded);
    ++checked;
  }
  return checked;
}

}  // namespace

TEST_CASE("tokenizer.json: every Hugging Face reference line, encode and decode, chats rendered byte for byte") {
  TPCLI_REQUIRE_SHARED("reference/hf-tokenizers/llama3.jsonl");
  SECTION("mistral (SentencePiece-style BPE with byte fallback)") { CHECK(check_reference("mistral") == 40); }
  SECTION("llama3 (byte-level BPE, ignore_merges)") { CHECK(check_reference("llama3") == 42); }
  SECTION("qwen3 (byte-level BPE with NFC)") { CHECK(check_reference("qwen3") == 42); }
}
