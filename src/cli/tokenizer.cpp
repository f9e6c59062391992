// tpcli tokenizer encode|decode|chat --tokenizer PATH
//   encode: stdin (exactly, a final newline included) -> a JSON array of ids (no BOS unless --bos;
//           special-token text becomes the token unless --no-parse-special, GGUF files only:
//           llama.cpp's parse_special = false)
//   decode: a JSON array of ids on stdin -> the text (nothing added)
//   chat:   a JSON list of messages on stdin -> the rendered prompt with the generation prompt
//           (--ids: its ids as a JSON array; --template NAME|FILE picks the template)
//   chat --chat-template FILE.jinja --special-tokens TOKENS.json: no tokenizer; one object
//           {"messages", "tools"?, "documents"?, "add_generation_prompt", "extra"?} on stdin ->
//           the rendering, byte for byte (transformers' apply_chat_template(..., tokenize=False))
// PATH: a tokenizer.json, a directory holding one (and tokenizer_config.json), a llama2.c
// tokenizer.bin, or a GGUF file (the tokenizer it carries). stderr gets the load time with --verbose.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <iomanip>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "cli/tokenizer_setup.h"
#include "files/regular_file.h"
#include "text/gguf_tokenizer.h"

namespace tpcli::cli {

namespace {

struct TokenizerFlags {
  std::string path;
  bool bos = false;
  bool no_parse_special = false;
  bool ids = false;
  bool verbose = false;
  bool no_generation_prompt = false;
  ChatTemplateFlags chat_template;
  std::string chat_template_file;  // --chat-template: render a template alone, as transformers does
  std::string special_tokens_file;
  std::string now;                 // --now: the clock strftime_now reads
};

text::LoadedTokenizer open_timed(const TokenizerFlags& f) {
  const auto start = std::chrono::steady_clock::now();
  text::LoadedTokenizer loaded = open_tokenizer(f.path);
  if (f.verbose)
    std::fprintf(stderr, "loaded %s (%d tokens) in %.0f ms\n", loaded.path.c_str(), loaded.tokenizer->vocab_size(),
                 std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  return loaded;
}

void print_ids(const std::vector<int>& ids) {
  std::printf("%s\n", nlohmann::json(ids).dump().c_str());
}

void run_encode(const TokenizerFlags& f) {
  const text::LoadedTokenizer loaded = open_timed(f);
  if (!f.no_parse_special) {
    print_ids(loaded.tokenizer->encode_text(read_all(stdin), f.bos));
    return;
  }
  const auto* gguf = dynamic_cast<const text::GgufTokenizer*>(loaded.tokenizer.get());
  if (!gguf) throw UsageError("--no-parse-special: only a GGUF file's tokenizer reads special-token text as plain text");
  print_ids(gguf->encode(read_all(stdin), f.bos, /*parse_special=*/false));
}

void run_decode(const TokenizerFlags& f) {
  const text::LoadedTokenizer loaded = open_timed(f);
  nlohmann::json ids;
  try {
    ids = nlohmann::json::parse(read_all(stdin));
  } catch (const nlohmann::json::parse_error& e) {
    throw UsageError("stdin: not valid JSON (byte " + std::to_string(e.byte) + ")");
  } catch (const nlohmann::json::exception& e) {  // a number too large, ...: not a parse_error
    throw UsageError(std::string("stdin: not valid JSON: ") + e.what());
  }
  if (!ids.is_array()) throw UsageError("stdin: expected a JSON array of token ids");
  std::vector<int> tokens;
  const int vocab = loaded.tokenizer->vocab_size();
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!ids[i].is_number_integer() || ids[i].get<int64_t>() < 0 || ids[i].get<int64_t>() >= vocab)
      throw UsageError("stdin: element " + std::to_string(i) + " = " + ids[i].dump() + " is not a token id in 0.." +
                       std::to_string(vocab - 1));
    tokens.push_back(ids[i].get<int>());
  }
  const std::string text = loaded.tokenizer->decode_ids(tokens);
  std::fwrite(text.data(), 1, text.size(), stdout);
}

// The special tokens of a tokenizer_config.json-like object that have a value: a null or empty one
// stays undefined in the template.
nlohmann::ordered_json special_tokens(const std::string& path) {
  nlohmann::ordered_json tokens = nlohmann::ordered_json::object(), all;
  try {
    all = nlohmann::ordered_json::parse(files::read_text_file(path, "a special-tokens JSON file"));
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(path + ": not valid JSON: " + e.what());
  } catch (const std::runtime_error& e) {
    throw UsageError(e.what());
  }
  if (!all.is_object()) throw UsageError(path + ": expected a JSON object of special tokens");
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
                          "additional_special_tokens"})
    if (all.contains(key) && !all[key].is_null() && !all[key].empty()) tokens[key] = all[key];
  return tokens;
}

// stdin's {"messages", "tools"?, "documents"?, "add_generation_prompt", "extra"?} as the variables
// apply_chat_template passes: tools and documents none when absent, extra's keys over the tokens.
nlohmann::ordered_json chat_variables(const nlohmann::ordered_json& tokens) {
  nlohmann::ordered_json in;
  try {
    in = nlohmann::ordered_json::parse(read_all(stdin));
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(std::string("stdin: not valid JSON: ") + e.what());
  }
  if (!in.is_object() || !in.contains("messages") || !in["messages"].is_array())
    throw UsageError("stdin: expected an object with a \"messages\" list");
  nlohmann::ordered_json v = tokens;
  v["messages"] = in["messages"];
  v["tools"] = in.value("tools", nlohmann::ordered_json(nullptr));
  v["documents"] = in.value("documents", nlohmann::ordered_json(nullptr));
  v["add_generation_prompt"] = in.value("add_generation_prompt", false);
  if (in.contains("extra")) {
    if (!in["extra"].is_object()) throw UsageError("stdin: \"extra\" is not an object");
    for (const auto& [key, value] : in["extra"].items()) v[key] = value;
  }
  return v;
}

std::tm parse_now(const std::string& text) {
  std::tm now{};
  std::istringstream in(text);
  in >> std::get_time(&now, text.size() > 10 ? "%Y-%m-%dT%H:%M:%S" : "%Y-%m-%d");
  if (in.fail()) throw UsageError("--now " + text + ": expected YYYY-MM-DD or YYYY-MM-DDTHH:MM:SS");
  std::tm normalized = now;
  timegm(&normalized);  // fills the weekday and the day of the year
  return normalized;
}

void run_template_render(const TokenizerFlags& f) {
  if (f.special_tokens_file.empty()) throw UsageError("--chat-template needs --special-tokens TOKENS.json");
  text::ChatTemplate chat;
  try {
    chat = text::chat_template_named(f.chat_template_file);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  const nlohmann::ordered_json variables = chat_variables(special_tokens(f.special_tokens_file));
  text::RenderOptions options;
  if (!f.now.empty()) options.now = parse_now(f.now);
  std::string text;
  try {
    text = chat.jinja->render(variables, options);
  } catch (const text::TemplateError& e) {
    throw std::runtime_error(f.chat_template_file + ": " + e.what());
  }
  std::fwrite(text.data(), 1, text.size(), stdout);
}

void run_chat_render(const TokenizerFlags& f) {
  if (!f.chat_template_file.empty()) return run_template_render(f);
  if (f.path.empty()) throw UsageError("tpcli tokenizer chat: --tokenizer is required (or --chat-template with --special-tokens)");
  const text::LoadedTokenizer loaded = open_timed(f);
  const ChatFormatting formatting = chat_formatting(loaded, f.chat_template);
  const std::vector<text::ChatMessage> messages = parse_messages(read_all(stdin), "stdin");
  std::string prompt;
  try {
    prompt = text::render_chat(formatting.chat_template, messages, formatting.tokens, !f.no_generation_prompt);
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("chat template ") + formatting.chat_template.name +
                     ": " + e.what());
  }
  if (f.ids) {
    print_ids(loaded.tokenizer->encode_text(prompt, /*bos=*/false));
  } else {
    std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  }
}

void add_common(CLI::App& sub, TokenizerFlags& f) {
  sub.add_option("--tokenizer", f.path, "tokenizer.json, a model directory holding one, or a llama2.c tokenizer.bin")
      ->required();
  sub.add_flag("--verbose", f.verbose, "print the load time on stderr");
}

void setup_tokenizer(CLI::App& sub) {
  auto flags = std::make_shared<TokenizerFlags>();
  CLI::App* encode = sub.add_subcommand("encode", "stdin text -> JSON array of token ids");
  add_common(*encode, *flags);
  encode->add_flag("--bos", flags->bos, "prepend the beginning-of-sequence token (a GGUF file's: BOS and EOS as its keys say)");
  encode->add_flag("--no-parse-special", flags->no_parse_special,
                   "special-token text (\"<|im_end|>\") stays text, as llama.cpp's parse_special = false (GGUF files)");
  encode->callback([flags] { run_encode(*flags); });

  CLI::App* decode = sub.add_subcommand("decode", "JSON array of token ids on stdin -> text");
  add_common(*decode, *flags);
  decode->callback([flags] { run_decode(*flags); });

  CLI::App* chat = sub.add_subcommand("chat", "JSON list of messages on stdin -> the chat template's prompt");
  chat->add_option("--tokenizer", flags->path, "tokenizer.json, a model directory holding one, or a llama2.c tokenizer.bin");
  chat->add_flag("--verbose", flags->verbose, "print the load time on stderr");
  chat->add_option("--chat-template", flags->chat_template_file,
                   "render this .jinja alone (no tokenizer): stdin holds {messages, tools?, documents?, add_generation_prompt, extra?}");
  chat->add_option("--special-tokens", flags->special_tokens_file, "with --chat-template: a JSON object of bos_token, eos_token, ...");
  chat->add_option("--now", flags->now, "with --chat-template: the date strftime_now() sees, YYYY-MM-DD[THH:MM:SS] (default: now)");
  chat->add_flag("--ids", flags->ids, "print the prompt's token ids instead of its text");
  add_chat_template_flags(*chat, flags->chat_template);
  chat->add_flag("--no-generation-prompt", flags->no_generation_prompt, "leave out the assistant's opening");
  chat->callback([flags] { run_chat_render(*flags); });
  sub.require_subcommand(1);
}

const bool registered =
    register_command({"tokenizer", "Encode, decode and render chats with a tokenizer (tokenizer.json or llama2.c)",
                      setup_tokenizer});

}  // namespace

}  // namespace tpcli::cli
