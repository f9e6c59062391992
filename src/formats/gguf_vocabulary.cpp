// tpcli::formats — a GGUF file's tokenizer keys (see gguf_vocabulary.h).
#include "formats/gguf_vocabulary.h"

#include <stdexcept>

#include "formats/gguf_model.h"

namespace tpcli::formats {

std::optional<text::GgufVocabulary> read_gguf_vocabulary(const gguf::GgufFile& file) {
  const std::optional<std::string> model = file.string("tokenizer.ggml.model");
  std::optional<std::vector<std::string>> tokens = file.strings("tokenizer.ggml.tokens");
  if (!model && !tokens) return std::nullopt;
  if (!model) throw std::runtime_error(file.path() + ": tokenizer.ggml.tokens without tokenizer.ggml.model");
  if (!tokens) throw std::runtime_error(file.path() + ": tokenizer.ggml.model without tokenizer.ggml.tokens");

  text::GgufVocabulary v;
  v.origin = file.path();
  v.model = *model;
  v.pre = file.string("tokenizer.ggml.pre");
  v.general_name = file.string("general.name").value_or("");
  v.tokens = std::move(*tokens);
  if (const auto scores = file.numbers("tokenizer.ggml.scores"))
    v.scores.assign(scores->begin(), scores->end());
  if (const auto types = file.integers("tokenizer.ggml.token_type"))
    v.token_types.assign(types->begin(), types->end());
  v.merges = file.strings("tokenizer.ggml.merges");
  v.bos_id = file.integer("tokenizer.ggml.bos_token_id");
  v.eos_id = file.integer("tokenizer.ggml.eos_token_id");
  v.eot_id = file.integer("tokenizer.ggml.eot_token_id");
  v.eom_id = file.integer("tokenizer.ggml.eom_token_id");
  v.unk_id = file.integer("tokenizer.ggml.unknown_token_id");
  v.pad_id = file.integer("tokenizer.ggml.padding_token_id");
  v.add_bos = file.boolean("tokenizer.ggml.add_bos_token");
  v.add_eos = file.boolean("tokenizer.ggml.add_eos_token");
  v.add_space_prefix = file.boolean("tokenizer.ggml.add_space_prefix");
  v.chat_template = file.string("tokenizer.chat_template");
  return v;
}

text::LoadedTokenizer load_gguf_tokenizer(const std::string& path) {
  const gguf::GgufFile file(path);
  std::optional<text::GgufVocabulary> vocabulary = read_gguf_vocabulary(file);
  if (!vocabulary)
    throw std::runtime_error(path + ": this GGUF file holds no tokenizer (no tokenizer.ggml.model / tokenizer.ggml.tokens); "
                             "pass one with -z/--tokenizer");
  text::LoadedTokenizer loaded;
  loaded.tokenizer = std::make_unique<text::GgufTokenizer>(*vocabulary);
  loaded.chat_template = vocabulary->chat_template;
  loaded.path = path;
  return loaded;
}

text::LoadedTokenizer load_tokenizer(const std::string& path, std::optional<int> vocab_size) {
  if (looks_like_gguf(path)) return load_gguf_tokenizer(path);
  return text::load_tokenizer(path, vocab_size);
}

}  // namespace tpcli::formats
