// tokenizer.json tokenizers and chat templates vs Hugging Face: every line of
// ../shared/reference/hf-tokenizers/*.jsonl (ids made by transformers.js and checked by a second
// implementation; chats rendered by jinja2 as transformers configures it) must be reproduced:
// encode, decode, and the chat template's rendering and ids.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <random>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "reference_files.h"
#include "support/temp_dir.h"
#include "text/chat_template.h"
#include "text/hf_pipeline.h"
#include "text/hf_tokenizer.h"
#include "text/load_tokenizer.h"

using namespace tpcli::text;
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
      const ChatTemplate chat_template = chat_template_from_source(*loaded.chat_template, name);
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

namespace {

// A small byte-level tokenizer.json: the 256 byte characters, merges "a b" -> "ab", "ab c" -> "abc".
nlohmann::json small_tokenizer() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[hf::byte_to_unicode()[static_cast<size_t>(b)]] = b;
  vocab["ab"] = 256;
  vocab["abc"] = 257;
  return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"a b", "ab c"}}}},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"added_tokens", {{{"id", 258}, {"content", "<|end|>"}, {"special", true}}}}};
}

// The message of loading `file` (written to `dir`), or "" when it loads.
std::string load_error(const tpcli::testing::TempDir& dir, const std::string& text) {
  const std::string path = dir.write("tokenizer.json", text);
  try {
    HfTokenizer tokenizer(path, {});
    (void)tokenizer.encode_text("abc <|end|> x\xC3\xA9", false);
    return "";
  } catch (const std::runtime_error& e) {
    return e.what();
  }
}

}  // namespace

TEST_CASE("tokenizer.json: a broken file is a one-line error naming the file and the key") {
  tpcli::testing::TempDir dir;
  const std::string path = (dir.path() / "tokenizer.json").string();
  CHECK(load_error(dir, small_tokenizer().dump()).empty());
  auto check = [&](nlohmann::json file, const std::string& word) {
    const std::string message = load_error(dir, file.dump());
    INFO(message);
    CHECK(message.rfind(path + ":", 0) == 0);
    CHECK(message.find('\n') == std::string::npos);
    CHECK(message.find(word) != std::string::npos);
  };
  nlohmann::json f = small_tokenizer();
  f["model"]["merges"].push_back("a z9");
  check(f, "merges[2]");
  f = small_tokenizer();
  f["model"]["merges"][1] = 7;
  check(f, "merges[1]");
  f = small_tokenizer();
  f["model"]["vocab"] = nlohmann::json::array();
  check(f, "vocab");
  f = small_tokenizer();
  f["model"]["vocab"] = nlohmann::json::object();  // would encode every text to []
  check(f, "model.vocab: empty");
  f = small_tokenizer();
  f["model"]["type"] = "WordPiece";
  check(f, "WordPiece");
  f = small_tokenizer();
  f["model"]["unk_token"] = "<unk>";
  check(f, "unk_token");
  f = small_tokenizer();
  f["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(\\p{L"}}}, {"behavior", "Isolated"}};
  check(f, "regex");
  f = small_tokenizer();
  f["pre_tokenizer"] = {{"type", "Whitespace"}};
  check(f, "Whitespace");
  f = small_tokenizer();
  f["pre_tokenizer"]["add_prefix_space"] = "yes";
  check(f, "pre_tokenizer");
  f = small_tokenizer();
  f["decoder"] = {{"type", "WordPiece"}};
  check(f, "decoder");
  f = small_tokenizer();
  f["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "BertNormalizer"}}}}};
  check(f, "normalizers[0]");
  f = small_tokenizer();
  f["added_tokens"][0]["id"] = -4;
  check(f, "added_tokens[0]");
  check(nlohmann::json::array(), "model");
  const std::string truncated = load_error(dir, small_tokenizer().dump().substr(0, 500));
  CHECK(truncated.find("not valid JSON") != std::string::npos);
}

TEST_CASE("tokenizer.json: random byte damage loads or fails with one line, never crashes") {
  tpcli::testing::TempDir dir;
  const std::string good = small_tokenizer().dump();
  std::mt19937 rng(7);
  int failed = 0;
  for (int trial = 0; trial < 300; ++trial) {
    std::string text = good;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) text[rng() % text.size()] = static_cast<char>(rng() % 128);
    const std::string message = load_error(dir, text);
    if (message.empty()) continue;
    ++failed;
    INFO(message);
    CHECK(message.find('\n') == std::string::npos);
  }
  CHECK(failed > 0);
}

TEST_CASE("tokenizer.json: Split's delimiter behaviours, as the tokenizers library documents them") {
  // The library's documentation splits "the-final--countdown" at "-" with each behaviour.
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"Removed", {"the", "final", "countdown"}},
      {"Isolated", {"the", "-", "final", "-", "-", "countdown"}},
      {"MergedWithPrevious", {"the-", "final-", "-", "countdown"}},
      {"MergedWithNext", {"the", "-final", "-", "-countdown"}},
      {"Contiguous", {"the", "-", "final", "--", "countdown"}}};
  for (const auto& [behavior, expected] : cases) {
    INFO(behavior);
    const nlohmann::json spec = {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", false}};
    std::vector<std::string> pieces;
    for (const hf::Piece& p : hf::make_pre_tokenizer(spec, "test")({{"the-final--countdown", true}})) pieces.push_back(p.text);
    CHECK(pieces == expected);
  }
}

namespace {

// small_tokenizer()'s text with `key` set to Sequences nested `depth` deep around `leaf`. Written
// as text: nlohmann's dump() would itself recurse once per level.
std::string nested_pipeline(const std::string& key, const std::string& list_key, const std::string& leaf, int depth) {
  nlohmann::json file = small_tokenizer();
  file.erase(key);
  std::string text = file.dump();
  std::string nested;
  nested.reserve(static_cast<size_t>(depth) * (list_key.size() + 30) + leaf.size());
  for (int i = 0; i < depth; ++i) nested += R"({"type":"Sequence",")" + list_key + R"(":[)";
  nested += leaf;
  for (int i = 0; i < depth; ++i) nested += "]}";
  return text.insert(1, "\"" + key + "\":" + nested + ",");
}

struct PipelinePart {
  std::string key, list_key, leaf;
};

const PipelinePart PIPELINE_PARTS[] = {
    {"decoder", "decoders", R"({"type":"ByteLevel"})"},
    {"normalizer", "normalizers", R"({"type":"Lowercase"})"},
    {"pre_tokenizer", "pretokenizers", R"({"type":"ByteLevel","add_prefix_space":false})"}};

}  // namespace

TEST_CASE("tokenizer.json: Sequences nested 100,000 deep are a one-line error naming file and key, not a crash") {
  tpcli::testing::TempDir dir;
  const std::string path = (dir.path() / "tokenizer.json").string();
  for (const PipelinePart& part : PIPELINE_PARTS) {
    INFO(part.key);
    CHECK(load_error(dir, nested_pipeline(part.key, part.list_key, part.leaf, 8)).empty());  // generous: real files nest 2-3
    // Past the JSON bound (256 levels): refused before it is parsed into a deep value.
    const std::string deep = load_error(dir, nested_pipeline(part.key, part.list_key, part.leaf, 100000));
    INFO(deep);
    CHECK(deep.rfind(path + ": " + part.key + ": JSON nested deeper than 256 levels", 0) == 0);
    CHECK(deep.find('\n') == std::string::npos);
    // Within it, past the builders' bound (64 Sequences): the key path, its middle elided.
    const std::string sequences = load_error(dir, nested_pipeline(part.key, part.list_key, part.leaf, 100));
    INFO(sequences);
    const std::string item = "." + part.list_key + "[0]";
    CHECK(sequences.rfind(path + ": " + part.key + item + item, 0) == 0);
    CHECK(sequences.find("more levels)" + item) != std::string::npos);
    CHECK(sequences.find("nested more than 64 levels deep") != std::string::npos);
    CHECK(sequences.size() < 400);
    CHECK(sequences.find('\n') == std::string::npos);
  }
}

TEST_CASE("tokenizer.json: a regex that exceeds PCRE2's limits names the file, the key and PCRE2's message") {
  tpcli::testing::TempDir dir;
  nlohmann::json file = small_tokenizer();
  // (a|aa)+$ backtracks through every split of a run of a's: exponential in its length.
  file["pre_tokenizer"] = {{"type", "Sequence"},
                           {"pretokenizers",
                            {{{"type", "Split"}, {"pattern", {{"Regex", "(a|aa)+$"}}}, {"behavior", "Isolated"}},
                             {{"type", "ByteLevel"}, {"add_prefix_space", false}}}}};
  const std::string path = dir.write("tokenizer.json", file.dump());
  const HfTokenizer tokenizer(path, {});
  std::string message;
  try {
    (void)tokenizer.encode_text(std::string(60, 'a') + "b", false);
  } catch (const std::runtime_error& e) {
    message = e.what();
  }
  INFO(message);
  CHECK(message.rfind(path + ": pre_tokenizer.pretokenizers[0].pattern.Regex: regex failed on the input: ", 0) == 0);
  CHECK(message.find("limit") != std::string::npos);  // PCRE2's own words ("match limit exceeded")
  CHECK(message.find('\n') == std::string::npos);
}

TEST_CASE("tokenizer.json: a folder named tokenizer.json or tokenizer_config.json is refused by name") {
  tpcli::testing::TempDir dir;
  const std::filesystem::path json_path = dir.path() / "tokenizer.json", config_path = dir.path() / "tokenizer_config.json";
  std::filesystem::create_directory(json_path);
  auto error_of_loading = [&] {
    try {
      (void)load_tokenizer(dir.path().string());
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(error_of_loading() == json_path.string() + ": is a directory, not a tokenizer.json");
  std::filesystem::remove(json_path);
  dir.write("tokenizer.json", small_tokenizer().dump());
  std::filesystem::create_directory(config_path);
  CHECK(error_of_loading() == config_path.string() + ": is a directory, not a tokenizer_config.json");
}

TEST_CASE("tokenizer.json: a newline in a type name, a vocabulary key or a merge keeps the error on one line") {
  tpcli::testing::TempDir dir;
  const std::string path = (dir.path() / "tokenizer.json").string();
  auto check = [&](const nlohmann::json& file, const std::string& escaped) {
    const std::string message = load_error(dir, file.dump());
    INFO(message);
    CHECK(message.rfind(path + ": ", 0) == 0);
    CHECK(message.find('\n') == std::string::npos);
    CHECK(message.find(escaped) != std::string::npos);  // shown as JSON shows it
  };
  nlohmann::json f = small_tokenizer();
  f["decoder"] = {{"type", "Word\nPiece"}};
  check(f, R"("Word\nPiece")");
  f = small_tokenizer();
  f["model"]["vocab"]["x\ny"] = -1;
  check(f, R"(vocab["x\ny"])");
  f = small_tokenizer();
  f["model"]["merges"].push_back("a\nb c");
  check(f, R"("a\nb")");
  f = small_tokenizer();
  f["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", "Iso\r\nlated"}};
  check(f, R"("Iso\r\nlated")");
  f = small_tokenizer();
  f["decoder"] = {{"type", std::string(5000, 'x')}};
  const std::string long_type = load_error(dir, f.dump());
  CHECK(long_type.size() < 300);  // the value cut, not a 5000-byte line
}
