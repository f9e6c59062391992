#include "train/sft_examples.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "files/json_file.h"
#include "files/line_reader.h"
#include "text/tokenizer_interface.h"

namespace tpcli::train {

namespace {

[[noreturn]] void fail(const std::string& where, const std::string& what) { throw SftDataError(where + ": " + what); }

const char* shape_of(SftFormat format) {
  switch (format) {
    case SftFormat::Chat: return "{\"messages\": [{\"role\": ..., \"content\": ...}, ...]}";
    case SftFormat::Completions: return "{\"prompt\": \"...\", \"completion\": \"...\"}";
    case SftFormat::Text: return "{\"text\": \"...\"}";
  }
  return "?";
}

std::string string_field(const nlohmann::json& object, const char* key, const std::string& where, SftFormat format) {
  const auto it = object.find(key);
  if (it == object.end() || !it->is_string())
    fail(where, std::string("expected ") + shape_of(format) + " (\"" + key + "\" " +
                    (it == object.end() ? "is missing" : "is not a string") + ")");
  return it->get<std::string>();
}

std::vector<text::ChatMessage> parse_messages(const nlohmann::json& object, const std::string& where) {
  const auto it = object.find("messages");
  if (it == object.end() || !it->is_array() || it->empty())
    fail(where, std::string("expected ") + shape_of(SftFormat::Chat) + " (\"messages\" " +
                    (it == object.end() ? "is missing" : it->is_array() ? "is empty" : "is not a list") + ")");
  std::vector<text::ChatMessage> messages;
  bool assistant = false;
  for (size_t i = 0; i < it->size(); ++i) {
    const nlohmann::json& m = (*it)[i];
    const std::string at = "message " + std::to_string(i);
    if (!m.is_object()) fail(where, at + " is not an object {\"role\": ..., \"content\": ...}");
    const auto role = m.find("role"), content = m.find("content");
    if (role == m.end() || !role->is_string()) fail(where, at + ": \"role\" is missing or not a string");
    if (content == m.end() || !content->is_string()) fail(where, at + ": \"content\" is missing or not a string");
    const std::string r = role->get<std::string>();
    if (r != "system" && r != "user" && r != "assistant")
      fail(where, at + ": unknown role " + files::quoted_value(r) + " (system, user or assistant)");
    assistant = assistant || r == "assistant";
    messages.push_back({r, content->get<std::string>()});
  }
  if (!assistant) fail(where, "no assistant message: nothing to learn from");
  return messages;
}

SftExample parse_line(std::string_view line, const std::string& where, SftFormat format) {
  nlohmann::json object;
  try {
    object = files::parse_json_text(line, where);
  } catch (const std::exception& e) {
    throw SftDataError(e.what());  // "FILE:LINE: not valid JSON at byte N: ..."
  }
  if (!object.is_object()) fail(where, std::string("expected a JSON object ") + shape_of(format));
  SftExample example;
  example.where = where;
  switch (format) {
    case SftFormat::Chat: example.messages = parse_messages(object, where); break;
    case SftFormat::Completions:
      example.prompt = string_field(object, "prompt", where, format);
      example.completion = string_field(object, "completion", where, format);
      break;
    case SftFormat::Text: example.text = string_field(object, "text", where, format); break;
  }
  return example;
}

std::optional<int> special_id(const text::TokenizerInterface& tokenizer, const std::string& text) {
  return text.empty() ? std::nullopt : tokenizer.token_id(text);
}

void append(EncodedExample& out, const std::vector<int>& tokens, bool counted) {
  out.tokens.insert(out.tokens.end(), tokens.begin(), tokens.end());
  out.counted.insert(out.counted.end(), tokens.size(), counted ? 1 : 0);
}

// A chat example's tokens, mask (assistant turns), and the token where its last assistant turn starts.
struct ChatEncoding {
  EncodedExample encoded;
  size_t last_assistant = 0;
};

ChatEncoding encode_chat(const SftExample& example, const SftEncoding& e) {
  using text::ChatMessage;
  const std::span<const ChatMessage> messages(example.messages);
  std::string full;
  try {
    full = text::render_chat(e.chat_template, messages, e.chat_tokens, /*add_generation_prompt=*/false);
  } catch (const std::exception& ex) {
    fail(example.where, std::string("the chat template refuses the conversation: ") + ex.what());
  }
  const std::vector<std::string> ends = text::end_of_turn_tokens(e.chat_template, e.chat_tokens);
  // Alternating segments of `full`: [prompt, assistant, prompt, assistant, ..., prompt].
  std::vector<size_t> cuts{0};
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role != "assistant") continue;
    std::string before;
    try {
      before = text::render_chat(e.chat_template, messages.first(i), e.chat_tokens, /*add_generation_prompt=*/true);
    } catch (const std::exception& ex) {
      fail(example.where, "the chat template refuses the turns before message " + std::to_string(i) + ": " + ex.what());
    }
    if (!full.starts_with(before) || before.size() < cuts.back())
      fail(example.where, "the chat template renders the turns before message " + std::to_string(i) +
                              " differently once an answer follows: its assistant tokens cannot be told apart");
    // The turn runs to the end of its first end-of-turn token (or the end of the text).
    size_t end = full.size();
    for (const std::string& token : ends)
      if (size_t at = full.find(token, before.size()); at != std::string::npos) end = std::min(end, at + token.size());
    cuts.push_back(before.size());
    cuts.push_back(end);
  }
  cuts.push_back(full.size());
  ChatEncoding out;
  for (size_t s = 0; s + 1 < cuts.size(); ++s) {
    const bool assistant = s % 2 == 1;
    if (assistant) out.last_assistant = out.encoded.tokens.size();
    if (cuts[s + 1] <= cuts[s]) continue;
    const std::string_view segment = std::string_view(full).substr(cuts[s], cuts[s + 1] - cuts[s]);
    append(out.encoded, e.tokenizer->encode_text(segment, /*bos=*/false), assistant || e.train_on_prompt);
  }
  return out;
}

}  // namespace

std::string_view sft_format_name(SftFormat format) {
  switch (format) {
    case SftFormat::Chat: return "chat";
    case SftFormat::Completions: return "completions";
    case SftFormat::Text: return "jsonl-text";
  }
  return "?";
}

std::vector<SftExample> read_sft_examples(const std::string& path, SftFormat format) {
  std::vector<SftExample> examples;
  try {
    files::LineReader lines(path, "a JSONL file");  // a line past its bound is refused, not read whole
    for (std::string line; lines.next(line);) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank
      examples.push_back(parse_line(line, lines.where(), format));
    }
  } catch (const SftDataError&) {
    throw;
  } catch (const std::runtime_error& e) {
    throw SftDataError(e.what());
  }
  if (examples.empty())
    throw SftDataError(path + ": no example (an empty file; one JSON object per line: " + shape_of(format) + ")");
  return examples;
}

int64_t EncodedExample::counted_targets() const {
  int64_t n = 0;
  for (size_t i = 1; i < counted.size(); ++i) n += counted[i];
  return n;
}

EncodedExample encode_example(const SftExample& example, const SftEncoding& e) {
  if (!e.tokenizer) throw std::invalid_argument("sft: no tokenizer");
  if (e.format == SftFormat::Chat) return encode_chat(example, e).encoded;
  EncodedExample out;
  const std::optional<int> bos = special_id(*e.tokenizer, e.tokenizer->bos_text());
  const std::optional<int> eos = special_id(*e.tokenizer, e.tokenizer->eos_text());
  if (bos) append(out, {*bos}, e.train_on_prompt);
  if (e.format == SftFormat::Completions) {
    append(out, e.tokenizer->encode_text(example.prompt, false), e.train_on_prompt);
    append(out, e.tokenizer->encode_text(example.completion, false), true);
  } else {
    append(out, e.tokenizer->encode_text(example.text, false), true);
  }
  if (eos) append(out, {*eos}, true);
  return out;
}

void fit_example(EncodedExample& example, const std::string& where, int seq_len, bool truncate) {
  const auto n = static_cast<int64_t>(example.tokens.size());
  if (n > int64_t{seq_len} + 1) {
    if (!truncate)
      fail(where, "the example is " + std::to_string(n) + " tokens, more than train.seq_len + 1 = " +
                      std::to_string(seq_len + 1) + " (raise train.seq_len, shorten it, or set data.truncate = true)");
    example.tokens.resize(static_cast<size_t>(seq_len) + 1);
    example.counted.resize(example.tokens.size());
    // A prompt of seq_len + 1 tokens or more leaves no target to learn: the loss would be 0 over none.
    if (example.counted_targets() == 0)
      fail(where, "data.truncate cut the example from " + std::to_string(n) + " to train.seq_len + 1 = " + std::to_string(seq_len + 1) +
                      " tokens, which keeps none of its answer tokens (raise train.seq_len or shorten its prompt)");
  }
  if (example.tokens.size() < 2) fail(where, "the example is " + std::to_string(n) + " token(s): nothing to train");
}

std::vector<EncodedExample> encode_sft_file(const std::string& path, const SftEncoding& encoding, int seq_len,
                                            bool truncate) {
  std::vector<EncodedExample> encoded;
  for (const SftExample& example : read_sft_examples(path, encoding.format)) {
    encoded.push_back(encode_example(example, encoding));
    fit_example(encoded.back(), example.where, seq_len, truncate);
  }
  return encoded;
}

EvalCase eval_case(const SftExample& example, const SftEncoding& e) {
  EvalCase c;
  c.where = example.where;
  if (e.format == SftFormat::Text) fail(example.where, "a text example has no prompt to answer (chat or completions)");
  if (e.format == SftFormat::Completions) {
    const std::optional<int> bos = special_id(*e.tokenizer, e.tokenizer->bos_text());
    c.prompt = e.tokenizer->encode_text(example.prompt, false);
    if (bos) c.prompt.insert(c.prompt.begin(), *bos);
    c.reference = trim_whitespace(example.completion);
    return c;
  }
  if (example.messages.back().role != "assistant")
    fail(example.where, "the last message is not the assistant's: no reference answer to compare with");
  SftEncoding masked = e;
  masked.train_on_prompt = false;
  const ChatEncoding chat = encode_chat(example, masked);
  c.prompt.assign(chat.encoded.tokens.begin(),
                  chat.encoded.tokens.begin() + static_cast<std::ptrdiff_t>(chat.last_assistant));
  c.reference = trim_whitespace(example.messages.back().content);
  return c;
}

std::string trim_whitespace(std::string_view text) {
  const char* space = " \t\r\n\v\f";
  const size_t first = text.find_first_not_of(space);
  if (first == std::string_view::npos) return "";
  return std::string(text.substr(first, text.find_last_not_of(space) - first + 1));
}

}  // namespace tpcli::train
