// tpcli tokenizer encode|decode|chat --tokenizer PATH
//   encode: stdin (exactly, a final newline included) -> a JSON array of ids (no BOS unless --bos)
//   decode: a JSON array of ids on stdin -> the text (nothing added)
//   chat:   a JSON list of messages on stdin -> the rendered prompt with the generation prompt
//           (--ids: its ids as a JSON array; --template NAME picks the format)
// PATH: a tokenizer.json, a directory holding one (and tokenizer_config.json), or a llama2.c
// tokenizer.bin. stderr gets the load time with --verbose.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/tokenizer_setup.h"

namespace tpcli::cli {

namespace {

struct TokenizerFlags {
  std::string path;
  bool bos = false;
  bool ids = false;
  bool verbose = false;
  bool no_generation_prompt = false;
  std::string template_name;
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
  print_ids(loaded.tokenizer->encode_text(read_all(stdin), f.bos));
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

void run_chat_render(const TokenizerFlags& f) {
  const text::LoadedTokenizer loaded = open_timed(f);
  const ChatFormatting formatting = chat_formatting(loaded, f.template_name);
  const std::vector<text::ChatMessage> messages = parse_messages(read_all(stdin), "stdin");
  std::string prompt;
  try {
    prompt = text::render_chat(formatting.chat_template, messages, formatting.tokens, !f.no_generation_prompt);
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("chat template ") + std::string(text::chat_format_name(formatting.chat_template.format)) +
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
  encode->add_flag("--bos", flags->bos, "prepend the beginning-of-sequence token");
  encode->callback([flags] { run_encode(*flags); });

  CLI::App* decode = sub.add_subcommand("decode", "JSON array of token ids on stdin -> text");
  add_common(*decode, *flags);
  decode->callback([flags] { run_decode(*flags); });

  CLI::App* chat = sub.add_subcommand("chat", "JSON list of messages on stdin -> the chat template's prompt");
  add_common(*chat, *flags);
  chat->add_flag("--ids", flags->ids, "print the prompt's token ids instead of its text");
  chat->add_option("--template", flags->template_name,
                   "chat format instead of tokenizer_config.json's: " + text::chat_format_names());
  chat->add_flag("--no-generation-prompt", flags->no_generation_prompt, "leave out the assistant's opening");
  chat->callback([flags] { run_chat_render(*flags); });
  sub.require_subcommand(1);
}

const bool registered =
    register_command({"tokenizer", "Encode, decode and render chats with a tokenizer (tokenizer.json or llama2.c)",
                      setup_tokenizer});

}  // namespace

}  // namespace tpcli::cli
