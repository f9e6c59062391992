#include "cli/tokenizer_setup.h"

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "cli/commands.h"
#include "formats/gguf_model.h"
#include "formats/gguf_vocabulary.h"
#include "text/gguf_tokenizer.h"

namespace tpcli::cli {

text::LoadedTokenizer open_tokenizer(const std::string& path, std::optional<int> vocab_size) {
  try {
    return formats::load_tokenizer(path, vocab_size);
  } catch (const std::runtime_error& e) {
    throw UsageError(e.what());
  }
}

bool is_llama2c_tokenizer(const std::string& path) {
  return !std::filesystem::is_directory(path) && std::filesystem::path(path).extension() != ".json" && !formats::looks_like_gguf(path);
}

std::optional<std::string> model_tokenizer_path(const std::string& flag, const formats::OpenedModel& opened) {
  if (!flag.empty()) return flag;
  if (opened.hf_dir) return opened.hf_dir;
  if (opened.missing_tokenizer) throw UsageError(*opened.missing_tokenizer);
  return opened.tokenizer;
}

text::LoadedTokenizer open_model_tokenizer(const std::string& path, int vocab_size) {
  text::LoadedTokenizer loaded = open_tokenizer(path, is_llama2c_tokenizer(path) ? std::optional<int>(vocab_size) : std::nullopt);
  if (loaded.tokenizer->vocab_size() > vocab_size)
    throw UsageError(loaded.path + ": tokenizer has " + std::to_string(loaded.tokenizer->vocab_size()) +
                     " tokens but the model's vocab_size is " + std::to_string(vocab_size));
  return loaded;
}

std::array<CLI::Option*, 2> add_chat_template_flags(CLI::App& sub, ChatTemplateFlags& flags) {
  CLI::Option* name = sub.add_option("--template", flags.name,
                                     "a bundled chat template (" + text::chat_template_names() +
                                         ") or a .jinja file instead of tokenizer_config.json's");
  CLI::Option* kwargs = sub.add_option("--chat-template-kwargs", flags.kwargs,
                                       "a JSON object of extra variables for the chat template, e.g. '{\"enable_thinking\": false}'");
  sub.add_option("--tool-parser", flags.tool_parser,
                 "the tool-call format of the model's answers (" + text::tool_call_format_names() + "); default: the one the chat template writes");
  return {name, kwargs};
}

void add_reasoning_parser_flag(CLI::App& sub, ChatTemplateFlags& flags) {
  sub.add_option("--reasoning-parser", flags.reasoning_parser,
                 "the reasoning markers of the model's answers, split off as reasoning_content (" + text::reasoning_parser_names() +
                     "); default: the ones the chat template mentions (<think>...</think>)");
}

namespace {

nlohmann::ordered_json template_kwargs(const std::string& text) {
  if (text.empty()) return nlohmann::ordered_json::object();
  nlohmann::ordered_json kwargs;
  try {
    kwargs = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw UsageError("--chat-template-kwargs: not valid JSON: " + std::string(e.what()));
  }
  if (!kwargs.is_object()) throw UsageError("--chat-template-kwargs: expected a JSON object, got " + text.substr(0, 100));
  return kwargs;
}

}  // namespace

ChatFormatting chat_formatting(const text::LoadedTokenizer& loaded, const ChatTemplateFlags& flags) {
  const std::string& template_name = flags.name;
  ChatFormatting f;
  f.tokens = {loaded.tokenizer->bos_text(), loaded.tokenizer->eos_text()};
  try {
    if (!template_name.empty()) {
      f.chat_template = text::chat_template_named(template_name);
    } else if (loaded.chat_template) {
      f.chat_template = text::chat_template_from_source(*loaded.chat_template, loaded.path + " chat_template");
    } else {
      const bool gguf = dynamic_cast<const text::GgufTokenizer*>(loaded.tokenizer.get()) != nullptr;
      throw UsageError(loaded.path + ": no chat template (" +
                       (gguf ? "no tokenizer.chat_template in this GGUF file" : "no chat_template in a tokenizer_config.json beside it") +
                       "); choose one with --template NAME (" + text::chat_template_names() + ")");
    }
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  } catch (const UsageError&) {
    throw;
  } catch (const std::runtime_error& e) {
    throw UsageError(loaded.path + ": " + e.what());
  }
  f.chat_template.extra = template_kwargs(flags.kwargs);
  if (!flags.tool_parser.empty()) {
    f.chat_template.tool_format = text::tool_call_format_named(flags.tool_parser);
    if (!f.chat_template.tool_format)
      throw UsageError("--tool-parser " + flags.tool_parser + ": not a tool-call format (" + text::tool_call_format_names() + ")");
  }
  if (flags.reasoning_parser == "none") {
    f.chat_template.reasoning.reset();
  } else if (!flags.reasoning_parser.empty()) {
    f.chat_template.reasoning = text::reasoning_markers_named(flags.reasoning_parser);
    if (!f.chat_template.reasoning)
      throw UsageError("--reasoning-parser " + flags.reasoning_parser + ": not a reasoning parser (" + text::reasoning_parser_names() + ")");
  }
  return f;
}

std::vector<text::ChatMessage> parse_messages(const std::string& json_text, const std::string& origin) {
  nlohmann::json list;
  try {
    list = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::parse_error& e) {
    throw UsageError(origin + ": not valid JSON (byte " + std::to_string(e.byte) + ")");
  } catch (const nlohmann::json::exception& e) {  // a number too large, ...: not a parse_error
    throw UsageError(origin + ": not valid JSON: " + e.what());
  }
  if (!list.is_array()) throw UsageError(origin + ": expected a JSON list of {\"role\": ..., \"content\": ...}");
  std::vector<text::ChatMessage> messages;
  for (size_t i = 0; i < list.size(); ++i) {
    const auto& m = list[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
        !m["content"].is_string())
      throw UsageError(origin + ": message " + std::to_string(i) + " must be {\"role\": \"...\", \"content\": \"...\"}");
    messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  return messages;
}

std::string read_all(std::FILE* in) {
  std::string text;
  char buffer[65536];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), in)) > 0) text.append(buffer, n);
  return text;
}

}  // namespace tpcli::cli
