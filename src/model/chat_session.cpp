#include "model/chat_session.h"

#include <algorithm>
#include <stdexcept>

#include "model/end_of_generation.h"
#include "model/text_stream.h"

namespace tpcli::model {

ChatSession::ChatSession(const TokenizerInterface& tokenizer, ChatTemplate chat_template, ChatTokens tokens,
                         ChatOptions options, int model_vocab, int seq_len)
    : tokenizer_(tokenizer),
      template_(std::move(chat_template)),
      tokens_(std::move(tokens)),
      options_(std::move(options)),
      model_vocab_(model_vocab),
      seq_len_(seq_len),
      sampler_(model_vocab, options_.temperature, options_.topp, options_.seed) {
  for (const std::string& name : end_of_turn_tokens(template_, tokens_))
    if (!tokenizer_.token_id(name))
      throw std::invalid_argument("end-of-turn token \"" + name + "\" of the " + std::string(chat_format_name(template_.format)) +
                                  " template is not in the tokenizer");
  end_ids_ = end_of_generation(tokenizer_, options_.more_end_ids, &template_, tokens_).ids;
  if (!options_.system.empty()) messages_.push_back({"system", options_.system});
}

bool ChatSession::is_end_of_turn(int id) const { return std::find(end_ids_.begin(), end_ids_.end(), id) != end_ids_.end(); }

TurnReport ChatSession::turn(const std::string& user_text, const ModelFns& model, std::FILE* out) {
  messages_.push_back({"user", user_text});
  const std::vector<int> prompt =
      tokenizer_.encode_text(render_chat(template_, messages_, tokens_, /*add_generation_prompt=*/true), false);
  if (prompt.empty()) throw std::runtime_error("chat template rendered an empty prompt");
  if (static_cast<int>(prompt.size()) >= seq_len_)
    throw std::runtime_error("the conversation (" + std::to_string(prompt.size()) +
                             " tokens) no longer fits the model's context of " + std::to_string(seq_len_));
  // Reuse the cache up to the common prefix; at least the last prompt token is fed, for its logits.
  const auto mismatch = std::mismatch(prompt.begin(), prompt.end(), cached_.begin(), cached_.end());
  const size_t reused = std::min(static_cast<size_t>(mismatch.first - prompt.begin()), prompt.size() - 1);

  TurnReport report;
  report.start_pos = static_cast<int>(reused);
  report.fed.assign(prompt.begin() + static_cast<long>(reused), prompt.end());
  TextStream stream(tokenizer_, {}, {});  // the text as the tokens spell it, each piece once final
  auto emit = [&](const std::string& text) {
    report.reply += text;
    if (out && !text.empty()) {
      std::fwrite(text.data(), 1, text.size(), out);
      std::fflush(out);
    }
  };
  report.end = TurnEnd::ContextFull;  // unless the reply ends first
  size_t forced_left = report.fed.size() - 1;  // picks that are the prompt's own next token
  const TokenLoop loop{report.fed, report.start_pos, seq_len_, options_.temperature == 0.0f, model_vocab_};
  const int end_pos = run_token_loop(model, sampler_, loop, [&](int, int next) {
    if (forced_left > 0) {
      --forced_left;
      return true;
    }
    report.generated.push_back(next);
    if (is_end_of_turn(next)) {
      report.end = TurnEnd::EndOfTurn;
      return false;  // not fed: the next turn's prompt writes it
    }
    emit(stream.add(next));
    if (static_cast<int>(report.generated.size()) >= options_.max_reply_tokens) {
      report.end = TurnEnd::ReplyLimit;
      return false;
    }
    return true;
  });
  emit(stream.flush());
  if (out) std::fputc('\n', out);

  // The cache now holds the prompt and every reply token fed (the last one picked was not).
  cached_.assign(prompt.begin(), prompt.end());
  cached_.insert(cached_.end(), report.generated.begin(), report.generated.end());
  cached_.resize(static_cast<size_t>(end_pos));
  messages_.push_back({"assistant", report.reply});
  return report;
}

std::string_view turn_end_name(TurnEnd end) {
  switch (end) {
    case TurnEnd::EndOfTurn: return "end_of_turn";
    case TurnEnd::ReplyLimit: return "reply_limit";
    case TurnEnd::ContextFull: return "context_full";
  }
  return "?";
}

}  // namespace tpcli::model
