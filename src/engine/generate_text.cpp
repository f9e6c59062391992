#include "engine/generate_text.h"

#include <algorithm>
#include <optional>
#include <string>
#include <stdexcept>

#include "text/text_stream.h"

namespace tpcli::engine {

GenerateResult tokenizer_text(const IdsRun& run, const text::TokenizerInterface& tokenizer, const std::vector<int>& stop_ids,
                              const std::string& prompt_text, std::FILE* out) {
  const std::vector<int> prompt = tokenizer.encode_text(prompt_text, /*bos=*/true);
  if (prompt.empty()) throw std::invalid_argument("empty prompt and the tokenizer has no BOS token to start from");
  const std::optional<int> bos = tokenizer.token_id(tokenizer.bos_text());
  std::string text;
  text::TextStream stream(tokenizer, {}, {});  // the text as the tokens spell it, each piece once final
  auto emit = [&](const std::string& piece) {
    text += piece;
    if (out && !piece.empty()) {
      std::fwrite(piece.data(), 1, piece.size(), out);
      std::fflush(out);
    }
  };
  if (!(bos && !tokenizer.bos_text().empty() && prompt[0] == *bos)) emit(stream.add(prompt[0]));
  size_t taken = 1;  // tokens of the run so far (prompt[0] first)
  GenerateResult result = run(prompt, [&](int, int next) {
    const bool generated = ++taken > prompt.size();
    if (generated && std::find(stop_ids.begin(), stop_ids.end(), next) != stop_ids.end()) return false;
    emit(stream.add(next));
    return true;
  });
  emit(stream.flush());
  emit("\n");
  result.text = std::move(text);
  return result;
}

GenerateResult generate_with_tokenizer(const ModelFns& model, const text::TokenizerInterface& tokenizer, int vocab,
                                       const std::vector<int>& stop_ids, const GenerateOptions& options,
                                       std::FILE* out) {
  const IdsRun run = [&](std::span<const int> prompt, const NextTokenFn& on_next) {
    return generate_from_ids(model, prompt, vocab, options, on_next);
  };
  return tokenizer_text(run, tokenizer, stop_ids, options.prompt, out);
}

}  // namespace tpcli::engine
