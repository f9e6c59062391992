#include "cli/gguf_vocabulary.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/tokenizer_setup.h"
#include "text/tokenizer.h"

namespace tpcli::cli {

namespace {

using formats::GgufVocabulary;
using formats::gguf_keys::TokenType;

int32_t type_number(TokenType t) { return static_cast<int32_t>(t); }

// "[PADn]" unused tokens up to the model's vocabulary, as llama.cpp's converters pad.
void pad_to(GgufVocabulary& v, int vocab_size, const std::string& origin) {
  if (static_cast<int>(v.tokens.size()) > vocab_size)
    throw UsageError(origin + ": the tokenizer has " + std::to_string(v.tokens.size()) + " tokens, more than the model's vocab_size " +
                     std::to_string(vocab_size));
  for (int i = static_cast<int>(v.tokens.size()); i < vocab_size; ++i) {
    v.tokens.push_back("[PAD" + std::to_string(i) + "]");
    v.token_types.push_back(type_number(TokenType::Unused));
    if (!v.scores.empty()) v.scores.push_back(-1000.0f);
  }
}

std::string spaces_as_sentencepiece(const std::string& piece) {
  std::string out;
  for (char ch : piece) out += ch == ' ' ? std::string("\xe2\x96\x81") : std::string(1, ch);
  return out;
}

bool is_byte_piece(const std::string& piece) {
  unsigned value = 0;
  char rest = 0;
  return piece.size() == 6 && std::sscanf(piece.c_str(), "<0x%2X>%c", &value, &rest) == 1;
}

GgufVocabulary llama2c_vocabulary(const std::string& path, int vocab_size) {
  text::Tokenizer tokenizer = [&] {
    try {
      return text::Tokenizer(path, vocab_size);
    } catch (const std::runtime_error& e) {
      throw UsageError(e.what());
    }
  }();
  GgufVocabulary v;
  v.model = "llama";
  for (int id = 0; id < tokenizer.vocab_size(); ++id) {
    std::string piece = tokenizer.piece(id);
    TokenType type = TokenType::Normal;
    if (id == text::UNK_TOKEN) piece = "<unk>", type = TokenType::Unknown;
    else if (id == text::BOS_TOKEN) piece = "<s>", type = TokenType::Control;
    else if (id == text::EOS_TOKEN) piece = "</s>", type = TokenType::Control;
    else if (piece.empty()) type = TokenType::Control;
    else if (is_byte_piece(piece)) type = TokenType::Byte;
    v.tokens.push_back(spaces_as_sentencepiece(piece));
    v.scores.push_back(tokenizer.score(id));
    v.token_types.push_back(type_number(type));
  }
  v.unknown_id = text::UNK_TOKEN;
  v.bos_id = text::BOS_TOKEN;
  v.eos_id = text::EOS_TOKEN;
  v.add_bos = true;  // run.c starts every prompt with BOS
  v.add_eos = false;
  return v;
}

nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw UsageError(path.string() + ": cannot be read");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(path.string() + ": not JSON (" + e.what() + ")");
  }
}

// The Split regex of a byte-level pre-tokenizer; "" for GPT-2's own ByteLevel(use_regex).
std::optional<std::string> split_regex(const nlohmann::json& pre) {
  if (!pre.is_object()) return std::nullopt;
  const std::string type = pre.value("type", "");
  if (type == "ByteLevel") return pre.value("use_regex", true) ? std::optional<std::string>("") : std::nullopt;
  if (type == "Split" && pre.contains("pattern") && pre["pattern"].contains("Regex")) return pre["pattern"]["Regex"].get<std::string>();
  if (type == "Sequence")
    for (const nlohmann::json& p : pre.value("pretokenizers", nlohmann::json::array()))
      if (p.value("type", "") == "Split") return split_regex(p);
  return std::nullopt;
}

// A token named by tokenizer_config.json: a string, or {"content": ...}.
std::optional<std::string> config_token(const nlohmann::json& config, const char* key) {
  if (!config.contains(key)) return std::nullopt;
  const nlohmann::json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return std::nullopt;
}

GgufVocabulary byte_level_vocabulary(const std::filesystem::path& json_path, int vocab_size) {
  const std::string where = json_path.string();
  const nlohmann::json j = read_json(json_path);
  const nlohmann::json& model = j.contains("model") ? j["model"] : nlohmann::json();
  if (model.value("type", "") != "BPE" || !model.contains("vocab") || !model["vocab"].is_object())
    throw UsageError(where + ": model.type is not BPE: only byte-level BPE tokenizer.json files are written to GGUF");
  const std::optional<std::string> regex = split_regex(j.contains("pre_tokenizer") ? j["pre_tokenizer"] : nlohmann::json());
  if (!regex)
    throw UsageError(where + ": the pre-tokenizer is not byte-level BPE (a SentencePiece-style tokenizer.json): not written to GGUF");
  const std::optional<std::string> pre = gguf_pre_tokenizer_name(*regex);
  if (!pre) throw UsageError(where + ": pre_tokenizer regex '" + regex->substr(0, 80) + "' has no llama.cpp pre-tokenizer name");
  std::map<int, std::pair<std::string, TokenType>> by_id;
  for (const auto& [token, id] : model["vocab"].items()) by_id[id.get<int>()] = {token, TokenType::Normal};
  for (const nlohmann::json& added : j.value("added_tokens", nlohmann::json::array()))
    by_id[added.at("id").get<int>()] = {added.at("content").get<std::string>(),
                                         added.value("special", false) ? TokenType::Control : TokenType::UserDefined};
  GgufVocabulary v;
  v.model = "gpt2";
  v.pre = *pre;
  const int size = by_id.empty() ? 0 : by_id.rbegin()->first + 1;
  for (int id = 0; id < size; ++id) {
    const auto it = by_id.find(id);
    v.tokens.push_back(it != by_id.end() ? it->second.first : "[PAD" + std::to_string(id) + "]");
    v.token_types.push_back(type_number(it != by_id.end() ? it->second.second : TokenType::Unused));
  }
  for (const nlohmann::json& merge : model.value("merges", nlohmann::json::array()))
    v.merges.push_back(merge.is_string() ? merge.get<std::string>() : merge.at(0).get<std::string>() + " " + merge.at(1).get<std::string>());
  pad_to(v, vocab_size, where);
  return v;
}

}  // namespace

std::optional<std::string> gguf_pre_tokenizer_name(const std::string& split_regex) {
  // tokenizer.json's regexes of the pre-tokenizers llama-vocab.cpp names (its comments quote them).
  static const std::map<std::string, std::string> NAMES = {
      {"", "gpt-2"},  // ByteLevel's own GPT-2 split
      {R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)", "gpt-2"},
      {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)", "llama-bpe"},
      {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)", "qwen2"},
  };
  const auto it = NAMES.find(split_regex);
  if (it == NAMES.end()) return std::nullopt;
  return it->second;
}

formats::GgufVocabulary gguf_vocabulary(const std::string& path, int vocab_size, std::optional<int> bos_id, std::optional<int> eos_id) {
  if (is_llama2c_tokenizer(path)) {
    GgufVocabulary v = llama2c_vocabulary(path, vocab_size);
    pad_to(v, vocab_size, path);
    return v;
  }
  const std::filesystem::path json_path = std::filesystem::is_directory(path) ? std::filesystem::path(path) / "tokenizer.json" : std::filesystem::path(path);
  GgufVocabulary v = byte_level_vocabulary(json_path, vocab_size);
  // The special ids and the chat template as tpcli's own tokenizer reads them.
  const text::LoadedTokenizer loaded = open_tokenizer(path);
  const text::TokenizerInterface& t = *loaded.tokenizer;
  const auto id_of = [&](const std::string& text) -> std::optional<uint32_t> {
    if (text.empty()) return std::nullopt;
    const std::optional<int> id = t.token_id(text);
    return id ? std::optional<uint32_t>(static_cast<uint32_t>(*id)) : std::nullopt;
  };
  v.bos_id = bos_id ? std::optional<uint32_t>(*bos_id) : id_of(t.bos_text());
  v.eos_id = eos_id ? std::optional<uint32_t>(*eos_id) : id_of(t.eos_text());
  const std::vector<int> with_bos = t.encode_text("a", true), without = t.encode_text("a", false);
  v.add_bos = with_bos.size() > without.size();
  v.add_eos = false;
  const std::filesystem::path config_path = json_path.parent_path() / "tokenizer_config.json";
  if (std::filesystem::exists(config_path)) {
    const nlohmann::json config = read_json(config_path);
    if (const auto pad = config_token(config, "pad_token")) v.padding_id = id_of(*pad);
    if (config.contains("add_bos_token") && config["add_bos_token"].is_boolean()) v.add_bos = config["add_bos_token"].get<bool>();
    if (config.contains("add_eos_token") && config["add_eos_token"].is_boolean()) v.add_eos = config["add_eos_token"].get<bool>();
  }
  v.chat_template = loaded.chat_template;
  return v;
}

}  // namespace tpcli::cli
