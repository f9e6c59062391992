#include "train/checkpoint.h"

#include <filesystem>
#include <stdexcept>

namespace tpcli::train {

std::string latest_checkpoint(const std::string& out_dir) {
  return (std::filesystem::path(out_dir) / "latest.safetensors").string();
}

void tokenizer_to_metadata(const TextTokenizer& tokenizer, Metadata& metadata) {
  metadata["tokenizer.kind"] = tokenizer.kind_name();
  if (tokenizer.kind() == TokenizerKind::Chars) {
    std::string list;
    for (char c : tokenizer.vocab()) {
      if (!list.empty()) list += ',';
      list += std::to_string(static_cast<unsigned char>(c));
    }
    metadata["tokenizer.chars"] = list;
  } else if (tokenizer.kind() == TokenizerKind::Llama2c || tokenizer.kind() == TokenizerKind::HfJson) {
    metadata["tokenizer"] = std::filesystem::absolute(tokenizer.path()).string();
  }
}

// formats/safetensors.h: a relative tokenizer path is relative to the checkpoint's folder.
static std::string resolve_tokenizer_path(const std::string& path, const std::string& checkpoint) {
  std::filesystem::path p(path);
  if (p.is_absolute()) return path;
  return (std::filesystem::path(checkpoint).parent_path() / p).string();
}

static std::string parse_byte_list(const std::string& list, const std::string& origin) {
  std::string vocab;
  size_t i = 0;
  while (i < list.size()) {
    size_t end = list.find(',', i);
    if (end == std::string::npos) end = list.size();
    const std::string item = list.substr(i, end - i);
    int value = -1;
    try {
      size_t used = 0;
      value = std::stoi(item, &used);
      if (used != item.size()) value = -1;
    } catch (const std::exception&) {
    }
    if (value < 0 || value > 255)
      throw std::runtime_error(origin + ": metadata tokenizer.chars holds '" + item + "', not a byte value 0..255");
    vocab.push_back(static_cast<char>(value));
    i = end + 1;
  }
  return vocab;
}

std::optional<TextTokenizer> tokenizer_from_metadata(const Metadata& metadata, const std::string& origin,
                                                     int vocab_size) {
  auto kind = metadata.find("tokenizer.kind");
  if (kind == metadata.end()) {
    auto path = metadata.find("tokenizer");
    if (path == metadata.end()) return std::nullopt;
    return TextTokenizer::llama2c(resolve_tokenizer_path(path->second, origin), vocab_size);
  }
  if (kind->second == "bytes") return TextTokenizer::bytes();
  if (kind->second == "chars") {
    auto chars = metadata.find("tokenizer.chars");
    if (chars == metadata.end()) throw std::runtime_error(origin + ": metadata tokenizer.kind = chars without tokenizer.chars");
    return TextTokenizer::chars_from_vocab(parse_byte_list(chars->second, origin));
  }
  if (kind->second == "llama2c") {
    auto path = metadata.find("tokenizer");
    if (path == metadata.end()) throw std::runtime_error(origin + ": metadata tokenizer.kind = llama2c without tokenizer");
    return TextTokenizer::llama2c(resolve_tokenizer_path(path->second, origin), vocab_size);
  }
  if (kind->second == "hf") {
    auto path = metadata.find("tokenizer");
    if (path == metadata.end()) throw std::runtime_error(origin + ": metadata tokenizer.kind = hf without tokenizer");
    return TextTokenizer::hf_json(resolve_tokenizer_path(path->second, origin));
  }
  throw std::runtime_error(origin + ": metadata tokenizer.kind = '" + kind->second + "' is not chars, bytes, llama2c or hf");
}

}  // namespace tpcli::train
