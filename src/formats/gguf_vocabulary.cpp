// tpcli::formats — a GGUF file's tokenizer keys (see gguf_vocabulary.h).
#include "formats/gguf_vocabulary.h"

#include <stdexcept>

#include "formats/gguf_keys.h"
#include "formats/gguf_model.h"

namespace tpcli::formats {

std::optional<text::GgufVocabulary> read_gguf_vocabulary(const gguf::GgufFile& file) {
  const std::optional<std::string> model = file.string(gguf_keys::TOKENIZER_MODEL);
  std::optional<std::vector<std::string>> tokens = file.strings(gguf_keys::TOKENS);
  if (!model && !tokens) return std::nullopt;
  if (!model) throw std::runtime_error(file.path() + ": tokenizer.ggml.tokens without tokenizer.ggml.model");
  if (!tokens) throw std::runtime_error(file.path() + ": tokenizer.ggml.model without tokenizer.ggml.tokens");

  text::GgufVocabulary v;
  v.origin = file.path();
  v.model = *model;
  v.pre = file.string(gguf_keys::TOKENIZER_PRE);
  v.general_name = file.string("general.name").value_or("");
  v.tokens = std::move(*tokens);
  if (const auto scores = file.numbers(gguf_keys::SCORES))
    v.scores.assign(scores->begin(), scores->end());
  if (const auto types = file.integers(gguf_keys::TOKEN_TYPE))
    v.token_types.assign(types->begin(), types->end());
  v.merges = file.strings(gguf_keys::MERGES);
  v.bos_id = file.integer(gguf_keys::BOS_ID);
  v.eos_id = file.integer(gguf_keys::EOS_ID);
  v.eot_id = file.integer(gguf_keys::EOT_ID);
  v.eom_id = file.integer(gguf_keys::EOM_ID);
  v.unk_id = file.integer(gguf_keys::UNKNOWN_ID);
  v.pad_id = file.integer(gguf_keys::PADDING_ID);
  v.add_bos = file.boolean(gguf_keys::ADD_BOS);
  v.add_eos = file.boolean(gguf_keys::ADD_EOS);
  v.add_space_prefix = file.boolean(gguf_keys::ADD_SPACE_PREFIX);
  v.chat_template = file.string(gguf_keys::CHAT_TEMPLATE);
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
