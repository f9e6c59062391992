// tpcli::text — a model's chat template, compiled once and rendered through the Jinja interpreter.
#include "text/chat_template.h"

#include <array>
#include <filesystem>
#include <stdexcept>

#include "files/regular_file.h"
#include "text/bundled_templates.h"

namespace tpcli::text {

namespace {

using nlohmann::ordered_json;

// Special tokens that end a model's turn, where a template writes them: Llama 3's and 3.1's tool
// turn, ChatML's, Phi-3's, Gemma's, Command-R's, gpt-oss's.
constexpr std::array<std::string_view, 7> END_OF_TURN_MARKERS = {
    "<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|END_OF_TURN_TOKEN|>", "<|return|>"};

std::vector<std::string> end_markers_of(std::string_view source) {
  std::vector<std::string> markers;
  for (std::string_view marker : END_OF_TURN_MARKERS)
    if (source.find(marker) != std::string_view::npos) markers.emplace_back(marker);
  return markers;
}

ordered_json variables_for(const ChatTemplate& t, const ordered_json& messages, const ordered_json& tools,
                           const ChatTokens& tokens, bool add_generation_prompt) {
  ordered_json v = {{"messages", messages}, {"tools", tools}, {"documents", nullptr}, {"add_generation_prompt", add_generation_prompt}};
  if (!tokens.bos.empty()) v["bos_token"] = tokens.bos;  // a token the tokenizer lacks stays undefined
  if (!tokens.eos.empty()) v["eos_token"] = tokens.eos;
  for (const auto& [key, value] : t.extra.items()) v[key] = value;
  return v;
}

}  // namespace

ChatTemplate chat_template_from_source(std::string_view source, std::string name) {
  try {
    return ChatTemplate{name, std::make_shared<const JinjaTemplate>(source), end_markers_of(source), tool_call_format_of_template(source),
                        reasoning_markers_of_template(source)};
  } catch (const TemplateError& e) {
    throw std::runtime_error(name + ": " + e.what());
  }
}

ChatTemplate chat_template_named(std::string_view name_or_path) {
  if (const auto source = bundled_template(name_or_path)) return chat_template_from_source(*source, std::string(name_or_path));
  const std::string path(name_or_path);
  if (!std::filesystem::is_regular_file(path))
    throw std::invalid_argument("unknown chat template \"" + path + "\": neither a bundled one (" + bundled_template_names() +
                                ") nor a file");
  return chat_template_from_source(files::read_text_file(path, "a chat template"), path);
}

std::string chat_template_names() { return bundled_template_names(); }

std::string render_chat_json(const ChatTemplate& t, const ordered_json& messages, const ordered_json& tools,
                             const ChatTokens& tokens, bool add_generation_prompt) {
  try {
    return t.jinja->render(variables_for(t, messages, tools, tokens, add_generation_prompt));
  } catch (const TemplateError& e) {
    throw std::invalid_argument(e.what());
  }
}

std::string render_chat(const ChatTemplate& t, std::span<const ChatMessage> messages, const ChatTokens& tokens,
                        bool add_generation_prompt) {
  ordered_json list = ordered_json::array();
  for (const ChatMessage& m : messages) list.push_back({{"role", m.role}, {"content", m.content}});
  return render_chat_json(t, list, nullptr, tokens, add_generation_prompt);
}

std::vector<std::string> end_of_turn_tokens(const ChatTemplate& t, const ChatTokens& tokens) {
  std::vector<std::string> ends = t.end_markers;
  if (!tokens.eos.empty() && std::find(ends.begin(), ends.end(), tokens.eos) == ends.end()) ends.push_back(tokens.eos);
  return ends;
}

}  // namespace tpcli::text
