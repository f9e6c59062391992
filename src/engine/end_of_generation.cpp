// tpcli::engine — the end-of-generation rule (see end_of_generation.h).
#include "engine/end_of_generation.h"

#include <algorithm>

#include "text/gguf_tokenizer.h"
#include "text/tokenizer.h"

namespace tpcli::engine {

using text::BOS_TOKEN;

EndOfGeneration end_of_generation(const text::TokenizerInterface& tokenizer, std::span<const int> config_eos_ids,
                                  const text::ChatTemplate* chat, const text::ChatTokens& chat_tokens) {
  EndOfGeneration end;
  const auto add_id = [&](int id) {
    if (!std::ranges::count(end.ids, id)) end.ids.push_back(id);
  };
  for (const int id : config_eos_ids) add_id(id);
  if (dynamic_cast<const text::Tokenizer*>(&tokenizer)) add_id(BOS_TOKEN);  // llama2.c's tokenizer.bin
  if (const auto* gguf = dynamic_cast<const text::GgufTokenizer*>(&tokenizer))  // llama.cpp's end-of-generation tokens
    for (const int id : gguf->end_of_generation_ids()) add_id(id);
  std::vector<std::string> texts = {tokenizer.eos_text()};
  if (chat)
    for (std::string& text : end_of_turn_tokens(*chat, chat_tokens)) texts.push_back(std::move(text));
  for (const std::string& text : texts) {
    if (text.empty() || std::ranges::count(end.texts, text)) continue;
    end.texts.push_back(text);
    if (const std::optional<int> id = tokenizer.token_id(text)) add_id(*id);
  }
  return end;
}

}  // namespace tpcli::engine
