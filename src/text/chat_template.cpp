#include "text/chat_template.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <optional>
#include <span>
#include <ctime>
#include <stdexcept>

#include "text/utf8.h"

namespace tpcli::text {

namespace {

constexpr std::array<std::pair<ChatFormat, std::string_view>, 7> FORMAT_NAMES{{
    {ChatFormat::Llama3, "llama3"},
    {ChatFormat::Llama3Dated, "llama3-dated"},
    {ChatFormat::ChatML, "chatml"},
    {ChatFormat::Qwen3, "qwen3"},
    {ChatFormat::Llama2, "llama2"},
    {ChatFormat::Mistral, "mistral"},
    {ChatFormat::Zephyr, "zephyr"},
}};

bool contains(std::string_view text, std::string_view part) { return text.find(part) != std::string_view::npos; }

// The special-token markers a format writes ("<|eot_id|>", ...). Recognition matches a few of
// them; a source that also writes one the format does not (Phi-3's "<|end|>" beside zephyr's
// "<|user|>", GLM's "<|observation|>") is another format, and rendering it as the one it
// resembles would be wrong without a word.
std::span<const std::string_view> markers_of(ChatFormat format) {
  static constexpr std::string_view ZEPHYR[] = {"<|user|>", "<|assistant|>", "<|system|>"};
  static constexpr std::string_view CHATML[] = {"<|im_start|>", "<|im_end|>"};
  static constexpr std::string_view LLAMA3[] = {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                                                 "<|python_tag|>", "<|eom_id|>"};  // Llama 3.1's tool turns, refused when rendered
  switch (format) {
    case ChatFormat::Zephyr: return ZEPHYR;
    case ChatFormat::ChatML:
    case ChatFormat::Qwen3: return CHATML;
    case ChatFormat::Llama3:
    case ChatFormat::Llama3Dated: return LLAMA3;
    default: return {};
  }
}

// The first "<|name|>" marker of `source` that `format` does not write, if any.
std::optional<std::string> foreign_marker(std::string_view source, ChatFormat format) {
  const std::span<const std::string_view> known = markers_of(format);
  for (size_t at = source.find("<|"); at != std::string_view::npos; at = source.find("<|", at + 2)) {
    size_t end = at + 2;
    while (end < source.size() && (std::isalnum(static_cast<unsigned char>(source[end])) || source[end] == '_')) ++end;
    if (end + 1 >= source.size() || source.substr(end, 2) != "|>" || end == at + 2) continue;
    const std::string_view marker = source.substr(at, end + 2 - at);
    if (std::ranges::find(known, marker) == known.end()) return std::string(marker);
  }
  return std::nullopt;
}

// Python's str.isspace, which Jinja's trim filter and str.strip() use.
bool is_python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Python's str.strip() / lstrip() / rstrip() with no argument.
std::string strip(std::string_view text, bool left = true, bool right = true) {
  size_t begin = 0, end = text.size();
  while (left && begin < end) {
    const auto cp = utf8::decode(text, begin);
    if (!is_python_space(cp.value)) break;
    begin += static_cast<size_t>(cp.length);
  }
  while (right && end > begin) {
    size_t lead = end - 1;
    while (lead > begin && (static_cast<unsigned char>(text[lead]) & 0xC0) == 0x80) --lead;
    if (!is_python_space(utf8::decode(text, lead).value)) break;
    end = lead;
  }
  return std::string(text.substr(begin, end - begin));
}

// Python's str.strip(chars) / lstrip(chars) / rstrip(chars) for one ASCII character.
std::string strip_char(std::string_view text, char c, bool left, bool right) {
  size_t begin = 0, end = text.size();
  while (left && begin < end && text[begin] == c) ++begin;
  while (right && end > begin && text[end - 1] == c) --end;
  return std::string(text.substr(begin, end - begin));
}

// The system prompt a ChatML template writes when the conversation has none, if it writes one as a
// literal ('<|im_start|>system\nYou are ...<|im_end|>'); "" otherwise.
std::string literal_default_system(std::string_view source) {
  for (std::string_view opening : {"<|im_start|>system\\n", "<|im_start|>system\n"}) {
    for (size_t at = source.find(opening); at != std::string_view::npos; at = source.find(opening, at + 1)) {
      const size_t begin = at + opening.size();
      const size_t end = source.find("<|im_end|>", begin);
      if (end == std::string_view::npos) continue;
      std::string_view text = source.substr(begin, end - begin);
      if (text.empty() || text.find_first_of("'\"{}+") != std::string_view::npos) continue;  // not a literal
      return utf8::replace_all(text, "\\n", "\n");
    }
  }
  return {};
}

std::string today_for_llama3() {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char text[32];
  std::strftime(text, sizeof(text), "%d %b %Y", &local);
  return text;
}

std::string header(std::string_view role) {
  return "<|start_header_id|>" + std::string(role) + "<|end_header_id|>\n\n";
}

std::string render_llama3(const ChatTemplate& t, std::span<const ChatMessage> messages, const ChatTokens& tokens,
                          bool add_generation_prompt) {
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (i == 0) out += tokens.bos;
    out += header(messages[i].role) + strip(messages[i].content) + "<|eot_id|>";
  }
  if (add_generation_prompt || t.generation_prompt_always) out += header("assistant");
  return out;
}

std::string render_llama3_dated(const ChatTemplate& t, std::span<const ChatMessage> messages,
                                const ChatTokens& tokens, bool add_generation_prompt) {
  std::string system;
  if (!messages.empty() && messages[0].role == "system") {
    system = strip(messages[0].content);
    messages = messages.subspan(1);
  }
  std::string out = tokens.bos + header("system") + "Cutting Knowledge Date: " + t.knowledge_cutoff + "\n" +
                    "Today Date: " + t.date + "\n\n" + system + "<|eot_id|>";
  for (const ChatMessage& m : messages) out += header(m.role) + strip(m.content) + "<|eot_id|>";
  if (add_generation_prompt) out += header("assistant");
  return out;
}

std::string chatml_turn(std::string_view role, std::string_view content) {
  return "<|im_start|>" + std::string(role) + "\n" + std::string(content) + "<|im_end|>\n";
}

std::string render_chatml(const ChatTemplate& t, std::span<const ChatMessage> messages, bool add_generation_prompt) {
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (i == 0 && messages[0].role != "system" && !t.default_system.empty()) out += chatml_turn("system", t.default_system);
    out += chatml_turn(messages[i].role, messages[i].content);
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

// Qwen3's assistant turn: reasoning split off at </think>; shown only after the last user query.
std::string qwen3_assistant(const ChatMessage& m, bool after_last_query, bool last) {
  std::string content = m.content, reasoning;
  if (const size_t close = m.content.find("</think>"); close != std::string::npos) {
    content = strip_char(std::string_view(m.content).substr(m.content.rfind("</think>") + 8), '\n', true, false);
    std::string before = strip_char(std::string_view(m.content).substr(0, close), '\n', false, true);
    const size_t open = before.rfind("<think>");
    reasoning = strip_char(open == std::string::npos ? before : before.substr(open + 7), '\n', true, false);
  }
  if (after_last_query && (last || !reasoning.empty()))
    return "<|im_start|>assistant\n<think>\n" + strip_char(reasoning, '\n', true, true) + "\n</think>\n\n" +
           strip_char(content, '\n', true, false) + "<|im_end|>\n";
  return "<|im_start|>assistant\n" + content + "<|im_end|>\n";
}

bool is_tool_response(std::string_view content) {
  return content.starts_with("<tool_response>") && content.ends_with("</tool_response>");
}

std::string render_qwen3(std::span<const ChatMessage> messages, bool add_generation_prompt) {
  std::string out;
  if (!messages.empty() && messages[0].role == "system") out += chatml_turn("system", messages[0].content);
  size_t last_query = messages.empty() ? 0 : messages.size() - 1;
  for (size_t i = messages.size(); i-- > 0;)
    if (messages[i].role == "user" && !is_tool_response(messages[i].content)) {
      last_query = i;
      break;
    }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const bool last = i + 1 == messages.size();
    if (m.role == "user" || (m.role == "system" && i > 0)) {
      out += chatml_turn(m.role, m.content);
    } else if (m.role == "assistant") {
      out += qwen3_assistant(m, i > last_query, last);
    } else if (m.role == "tool") {
      if (i == 0 || messages[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n" + m.content + "\n</tool_response>";
      if (last || messages[i + 1].role != "tool") out += "<|im_end|>\n";
    }
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

void check_alternating(std::span<const ChatMessage> messages) {
  for (size_t i = 0; i < messages.size(); ++i)
    if ((messages[i].role == "user") != (i % 2 == 0))
      throw std::invalid_argument("Conversation roles must alternate user/assistant/user/assistant/...");
}

std::string render_llama2(std::span<const ChatMessage> messages, const ChatTokens& tokens) {
  std::optional<std::string> system;
  if (!messages.empty() && messages[0].role == "system") {
    system = messages[0].content;
    messages = messages.subspan(1);
  }
  check_alternating(messages);
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    std::string content = messages[i].content;
    if (i == 0 && system) content = std::string("<<SYS>>\n").append(*system).append("\n<</SYS>>\n\n").append(content);
    if (messages[i].role == "user") out += tokens.bos + "[INST] " + strip(content) + " [/INST]";
    if (messages[i].role == "assistant") out += " " + strip(content) + " " + tokens.eos;
  }
  return out;
}

std::string render_mistral(std::span<const ChatMessage> messages, const ChatTokens& tokens) {
  check_alternating(messages);
  std::string out = tokens.bos;
  for (const ChatMessage& m : messages) {
    if (m.role == "user") {
      out += "[INST] " + m.content + " [/INST]";
    } else if (m.role == "assistant") {
      out += m.content + tokens.eos;
    } else {
      throw std::invalid_argument("Only user and assistant roles are supported!");
    }
  }
  return out;
}

std::string render_zephyr(std::span<const ChatMessage> messages, const ChatTokens& tokens, bool add_generation_prompt) {
  std::string out;
  for (const ChatMessage& m : messages)
    if (m.role == "user" || m.role == "system" || m.role == "assistant")
      out += "<|" + m.role + "|>\n" + m.content + tokens.eos + "\n";
  if (add_generation_prompt && !messages.empty()) out += "<|assistant|>\n";  // written inside the loop
  return out;
}

}  // namespace

std::string_view chat_format_name(ChatFormat format) {
  for (auto [f, name] : FORMAT_NAMES)
    if (f == format) return name;
  return "?";
}

std::string chat_format_names() {
  std::string names;
  for (auto [f, name] : FORMAT_NAMES) names += (names.empty() ? "" : ", ") + std::string(name);
  return names;
}

ChatTemplate chat_template_named(std::string_view name) {
  for (auto [format, known] : FORMAT_NAMES) {
    if (known != name) continue;
    ChatTemplate t{.format = format};
    if (format == ChatFormat::Llama3Dated) t.date = "26 Jul 2024";
    if (format == ChatFormat::Llama3) t.generation_prompt_always = false;
    return t;
  }
  throw std::invalid_argument("unknown chat template \"" + std::string(name) + "\" (known: " + chat_format_names() + ")");
}

ChatTemplate recognise_chat_template(std::string_view source) {
  ChatTemplate t;
  if (contains(source, "<|start_header_id|>") && contains(source, "Cutting Knowledge Date")) {
    t.format = ChatFormat::Llama3Dated;
    t.date = contains(source, "strftime_now") ? today_for_llama3() : "26 Jul 2024";
    if (const size_t at = source.find("Cutting Knowledge Date: "); at != std::string_view::npos) {
      const size_t begin = at + 24, end = source.find_first_of("\\\n\"'", begin);
      if (end != std::string_view::npos) t.knowledge_cutoff = std::string(source.substr(begin, end - begin));
    }
  } else if (contains(source, "<|start_header_id|>") && contains(source, "<|eot_id|>")) {
    t.format = ChatFormat::Llama3;
    t.generation_prompt_always = !contains(source, "add_generation_prompt");
  } else if (contains(source, "<|im_start|>") && contains(source, "</think>")) {
    t.format = ChatFormat::Qwen3;
  } else if (contains(source, "<|im_start|>")) {
    t.format = ChatFormat::ChatML;
    t.default_system = literal_default_system(source);
  } else if (contains(source, "[INST]") && contains(source, "<<SYS>>")) {
    t.format = ChatFormat::Llama2;
  } else if (contains(source, "[INST]") && !contains(source, "system_message")) {
    t.format = ChatFormat::Mistral;
  } else if (contains(source, "<|user|>") && contains(source, "<|assistant|>")) {
    t.format = ChatFormat::Zephyr;
  } else {
    throw std::runtime_error("chat template not recognised (known: " + chat_format_names() +
                             "; choose one with --template NAME)");
  }
  if (const auto marker = foreign_marker(source, t.format))
    throw std::runtime_error("chat template not recognised: it looks like " + std::string(chat_format_name(t.format)) + " but writes " +
                             *marker + ", which " + std::string(chat_format_name(t.format)) + " does not (known: " +
                             chat_format_names() + "; choose one with --template NAME)");
  return t;
}

std::string render_chat(const ChatTemplate& t, std::span<const ChatMessage> messages, const ChatTokens& tokens,
                        bool add_generation_prompt) {
  switch (t.format) {
    case ChatFormat::Llama3: return render_llama3(t, messages, tokens, add_generation_prompt);
    case ChatFormat::Llama3Dated: return render_llama3_dated(t, messages, tokens, add_generation_prompt);
    case ChatFormat::ChatML: return render_chatml(t, messages, add_generation_prompt);
    case ChatFormat::Qwen3: return render_qwen3(messages, add_generation_prompt);
    case ChatFormat::Llama2: return render_llama2(messages, tokens);
    case ChatFormat::Mistral: return render_mistral(messages, tokens);
    case ChatFormat::Zephyr: return render_zephyr(messages, tokens, add_generation_prompt);
  }
  throw std::logic_error("render_chat: unknown format");
}

std::vector<std::string> end_of_turn_tokens(const ChatTemplate& t, const ChatTokens& tokens) {
  std::vector<std::string> ends;
  if (t.format == ChatFormat::Llama3 || t.format == ChatFormat::Llama3Dated) ends.push_back("<|eot_id|>");
  if (t.format == ChatFormat::ChatML || t.format == ChatFormat::Qwen3) ends.push_back("<|im_end|>");
  if (!tokens.eos.empty() && (ends.empty() || ends[0] != tokens.eos)) ends.push_back(tokens.eos);
  return ends;
}

}  // namespace tpcli::text
