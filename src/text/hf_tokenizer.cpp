#include "text/hf_tokenizer.h"

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "files/json_file.h"
#include "text/utf8.h"

namespace tpcli::text {

using files::quoted_value;
using files::read_json_file;

using nlohmann::json;

namespace {

// bos_token / eos_token: a string, null, or an AddedToken object {"content": ...}.
std::string token_name(const json& config, const char* key, const std::string& path) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && it->at("content").is_string()) return it->at("content").get<std::string>();
  throw std::runtime_error(path + ": " + key + " must be a string or {\"content\": ...}");
}

// chat_template: the source, or a list of {"name", "template"} (the "default" one, else the first).
std::optional<std::string> chat_template_source(const json& config, const std::string& path) {
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array() && !it->empty()) {
    for (const json& entry : *it)
      if (entry.is_object() && entry.value("name", std::string()) == "default" && entry.contains("template"))
        return entry.at("template").get<std::string>();
    if ((*it)[0].is_object() && (*it)[0].contains("template") && (*it)[0].at("template").is_string())
      return (*it)[0].at("template").get<std::string>();
  }
  throw std::runtime_error(path + ": chat_template must be a string or a list of {\"name\", \"template\"}");
}

bool is_word_byte(char c) {
  const auto b = static_cast<unsigned char>(c);
  return b >= 0x80 || std::isalnum(b) || b == '_';
}

bool is_space_byte(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

// The first special token of a TemplateProcessing post-processor's "single" template (Llama 2's BOS).
std::string template_bos(const json& post_processor) {
  if (!post_processor.is_object() || post_processor.value("type", std::string()) != "TemplateProcessing") return {};
  auto single = post_processor.find("single");
  if (single == post_processor.end() || !single->is_array() || single->empty()) return {};
  const json& first = (*single)[0];
  if (!first.contains("SpecialToken") || !first["SpecialToken"].is_object()) return {};
  auto id = first["SpecialToken"].find("id");
  return id != first["SpecialToken"].end() && id->is_string() ? id->get<std::string>() : std::string();
}

}  // namespace

static TokenizerConfig read_tokenizer_config_json(const json& config, const std::string& path) {
  if (!config.is_object()) throw std::runtime_error(path + ": expected a JSON object");
  TokenizerConfig c;
  c.bos_token = token_name(config, "bos_token", path);
  c.eos_token = token_name(config, "eos_token", path);
  auto clean = config.find("clean_up_tokenization_spaces");
  if (clean != config.end() && !clean->is_null()) {
    if (!clean->is_boolean()) throw std::runtime_error(path + ": clean_up_tokenization_spaces must be true or false");
    c.clean_up_tokenization_spaces = clean->get<bool>();
  }
  c.chat_template = chat_template_source(config, path);
  return c;
}

TokenizerConfig read_tokenizer_config(const std::string& path) {
  try {
    return read_tokenizer_config_json(read_json_file(path, "a tokenizer_config.json"), path);
  } catch (const json::exception& e) {
    throw std::runtime_error(path + ": " + e.what());
  }
}

HfTokenizer::HfTokenizer(const std::string& path, const TokenizerConfig& config) {
  const json file = read_json_file(path, "a tokenizer.json");
  if (!file.is_object() || !file.contains("model")) throw std::runtime_error(path + ": no \"model\" (not a tokenizer.json?)");
  // Each part built with its key named: nlohmann's own errors (a value of the wrong type deep
  // inside) then still say which part of which file.
  static const json ABSENT;  // a part the file leaves out; by reference, so no part is ever copied
  auto part = [&](const char* key, const auto& build) {
    try {
      auto it = file.find(key);
      build(it != file.end() ? *it : ABSENT, path + ": " + key);
    } catch (const json::exception& e) {
      throw std::runtime_error(path + ": " + key + ": " + e.what());
    }
  };
  part("model", [&](const json& j, const std::string& where) { model_ = std::make_unique<hf::BpeModel>(j, where); });
  part("normalizer", [&](const json& j, const std::string& where) { normalizer_ = hf::make_normalizer(j, where); });
  part("pre_tokenizer", [&](const json& j, const std::string& where) { pre_tokenizer_ = hf::make_pre_tokenizer(j, where); });
  part("decoder", [&](const json& j, const std::string& where) { decoder_ = hf::make_decoder(j, where); });
  part("added_tokens", [&](const json& j, const std::string& where) {
    load_added_tokens(j.is_null() ? json::array() : j, where);
  });
  const auto post_processor = file.find("post_processor");
  bos_ = !config.bos_token.empty() ? config.bos_token : template_bos(post_processor != file.end() ? *post_processor : ABSENT);
  eos_ = config.eos_token;
  clean_up_spaces_ = config.clean_up_tokenization_spaces;
  for (const std::string* name : {&bos_, &eos_})
    if (!name->empty() && !token_id(*name))
      throw std::runtime_error(path + ": special token " + quoted_value(*name) + " of tokenizer_config.json is not in the vocabulary");
}

void HfTokenizer::load_added_tokens(const json& added, const std::string& where) {
  if (!added.is_array()) throw std::runtime_error(where + ": expected an array");
  for (size_t i = 0; i < added.size(); ++i) {
    const json& t = added[i];
    const std::string at = where + "[" + std::to_string(i) + "]";
    if (!t.is_object() || !t.contains("id") || !t.contains("content") || !t["content"].is_string() ||
        !t["id"].is_number_integer() || t["id"].get<int64_t>() < 0 || t["id"].get<int64_t>() > (1 << 24))
      throw std::runtime_error(at + ": expected {\"id\": 0..16777216, \"content\": \"...\"}");
    AddedToken token{t["content"].get<std::string>(), t["id"].get<int>(), t.value("special", false),
                     t.value("lstrip", false), t.value("rstrip", false), t.value("single_word", false)};
    if (token.content.empty()) throw std::runtime_error(at + ": empty content");
    added_ids_[token.content] = token.id;
    added_by_id_[token.id] = added_.size();
    added_.push_back(std::move(token));
  }
  added_by_byte_.assign(256, {});
  for (size_t i = 0; i < added_.size(); ++i)
    added_by_byte_[static_cast<unsigned char>(added_[i].content[0])].push_back(i);
  for (auto& list : added_by_byte_)
    std::stable_sort(list.begin(), list.end(),
                     [&](size_t a, size_t b) { return added_[a].content.size() > added_[b].content.size(); });
}

int HfTokenizer::vocab_size() const {
  int limit = model_->id_limit();
  for (const AddedToken& t : added_) limit = std::max(limit, t.id + 1);
  return limit;
}

std::optional<size_t> HfTokenizer::added_token_at(std::string_view text, size_t at) const {
  for (size_t index : added_by_byte_[static_cast<unsigned char>(text[at])]) {
    const AddedToken& t = added_[index];
    if (text.substr(at, t.content.size()) != t.content) continue;
    if (t.single_word) {
      const size_t end = at + t.content.size();
      if ((at > 0 && is_word_byte(text[at - 1])) || (end < text.size() && is_word_byte(text[end]))) continue;
    }
    return index;  // the longest that matches: the list is sorted longest first
  }
  return std::nullopt;
}

std::vector<HfTokenizer::Segment> HfTokenizer::split_at_added_tokens(std::string_view text) const {
  std::vector<Segment> segments;
  size_t text_begin = 0;  // start of the pending text span
  auto flush_text = [&](size_t end) {
    if (end > text_begin) segments.push_back({text.substr(text_begin, end - text_begin), -1, text_begin == 0});
  };
  for (size_t at = 0; at < text.size();) {
    const auto index = added_token_at(text, at);
    if (!index) {
      ++at;
      continue;
    }
    const AddedToken& t = added_[*index];
    size_t text_end = at;
    if (t.lstrip)
      while (text_end > text_begin && is_space_byte(text[text_end - 1])) --text_end;
    flush_text(text_end);
    segments.push_back({text.substr(at, t.content.size()), t.id, false});
    at += t.content.size();
    if (t.rstrip)
      while (at < text.size() && is_space_byte(text[at])) ++at;
    text_begin = at;
  }
  flush_text(text.size());
  return segments;
}

std::vector<int> HfTokenizer::encode_text(std::string_view raw, bool bos) const {
  const std::string text = utf8::lossy(raw);
  std::vector<int> ids;
  if (bos && !bos_.empty()) ids.push_back(*token_id(bos_));
  for (const Segment& segment : split_at_added_tokens(text)) {
    if (segment.id >= 0) {
      ids.push_back(segment.id);
      continue;
    }
    std::vector<hf::Piece> pieces{{normalizer_(std::string(segment.text)), segment.at_start}};
    for (const hf::Piece& piece : pre_tokenizer_(std::move(pieces))) model_->encode_word(piece.text, ids);
  }
  return ids;
}

std::string HfTokenizer::decode_ids(std::span<const int> ids, bool clean_up) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int id : ids) {
    std::string text = token_text(id);
    if (!text.empty()) tokens.push_back(std::move(text));  // unknown ids are skipped, as the library does
  }
  std::string text;
  for (const std::string& piece : decoder_(std::move(tokens))) text += piece;
  return clean_up && clean_up_spaces_ ? clean_up_tokenization(std::move(text)) : text;
}

std::string HfTokenizer::token_text(int id) const {
  if (auto it = added_by_id_.find(id); it != added_by_id_.end()) return added_[it->second].content;
  const std::string* text = model_->text_of(id);
  return text ? *text : std::string();
}

bool HfTokenizer::is_special_token(int id) const {
  const auto it = added_by_id_.find(id);
  return it != added_by_id_.end() && added_[it->second].special;
}

std::optional<int> HfTokenizer::token_id(std::string_view text) const {
  if (auto it = added_ids_.find(text); it != added_ids_.end()) return it->second;
  return model_->id_of(text);
}

std::string clean_up_tokenization(std::string text) {
  static const std::pair<std::string_view, std::string_view> REPLACEMENTS[] = {
      {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (auto [from, to] : REPLACEMENTS) text = utf8::replace_all(text, from, to);
  return text;
}

}  // namespace tpcli::text
