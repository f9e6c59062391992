#include "text/load_tokenizer.h"

#include <filesystem>
#include <stdexcept>

#include "text/hf_tokenizer.h"
#include "text/tokenizer.h"

namespace tpcli::text {

namespace fs = std::filesystem;

LoadedTokenizer load_tokenizer(const std::string& path, std::optional<int> vocab_size) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw std::runtime_error(path + ": no such tokenizer file or directory");
  fs::path json_path = path;
  if (fs::is_directory(path, ec)) {
    json_path = fs::path(path) / "tokenizer.json";
    if (!fs::exists(json_path, ec))
      throw std::runtime_error(path + ": no tokenizer.json in this directory; pass one with -z/--tokenizer "
                               "(a tokenizer.json, a directory holding one, or a llama2.c tokenizer.bin)");
  } else if (json_path.extension() != ".json") {
    return {std::make_unique<Tokenizer>(path, vocab_size), std::nullopt, path};
  }
  TokenizerConfig config;
  const fs::path config_path = json_path.parent_path() / "tokenizer_config.json";
  if (fs::exists(config_path, ec)) config = read_tokenizer_config(config_path.string());
  auto tokenizer = std::make_unique<HfTokenizer>(json_path.string(), config);
  return {std::move(tokenizer), config.chat_template, json_path.string()};
}

}  // namespace tpcli::text
