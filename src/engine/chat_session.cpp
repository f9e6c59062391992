#include "engine/chat_session.h"

#include <algorithm>
#include <stdexcept>

#include "engine/end_of_generation.h"
#include "engine/sampler.h"
#include "text/text_stream.h"

namespace tpcli::engine {

ChatSession::ChatSession(const text::TokenizerInterface& tokenizer, text::ChatTemplate chat_template, text::ChatTokens tokens,
                         ChatOptions options, int model_vocab, int seq_len)
    : tokenizer_(tokenizer),
      template_(std::move(chat_template)),
      tokens_(std::move(tokens)),
      options_(std::move(options)),
      model_vocab_(model_vocab),
      seq_len_(seq_len),
      sampler_state_(options_.seed) {
  (void)Sampler(model_vocab, options_.temperature, options_.topp, options_.seed, options_.sampling);  // bad settings throw here, before any turn
  for (const std::string& name : end_of_turn_tokens(template_, tokens_))
    if (!tokenizer_.token_id(name))
      throw std::invalid_argument("end-of-turn token \"" + name + "\" of the " + template_.name +
                                  " template is not in the tokenizer");
  end_ids_ = end_of_generation(tokenizer_, options_.more_end_ids, &template_, tokens_).ids;
  if (!options_.system.empty()) messages_.push_back({{"role", "system"}, {"content", options_.system}});
  if (!options_.tools.is_null() && !template_.tool_format)
    throw std::invalid_argument("the " + template_.name + " template writes no tool calls (--tool-parser names the format)");
}

bool ChatSession::is_end_of_turn(int id) const { return std::find(end_ids_.begin(), end_ids_.end(), id) != end_ids_.end(); }

namespace {

// One position a block, so a turn reuses exactly the longest prefix fed before; a pool of seq_len
// positions (the memory of the model's own KV cache).
EngineOptions chat_engine_options(const model::Llama& llama) {
  EngineOptions o;
  o.parallel = 1;
  o.block_size = 1;
  o.kv_blocks = llama.config().seq_len;
  o.kv_dtype = llama.kv_dtype();
  o.step_tokens = llama.config().seq_len;
  return o;
}

}  // namespace

TurnReport ChatSession::turn(const std::string& user_text, const ModelFns& model, std::FILE* out) {
  if (!model.llama) throw std::invalid_argument("chat session: no model to run the batch engine on (ModelFns::llama)");
  if (llama_ && llama_ != model.llama) throw std::invalid_argument("chat session: a turn on another model than the first");
  if (model.llama->config().vocab_size != model_vocab_ || model.llama->config().seq_len != seq_len_)
    throw std::invalid_argument("chat session: the model's vocabulary or context is not the session's");
  TurnReport report;
  if (!awaiting_.empty()) {
    const text::ToolCall call = awaiting_.front();
    awaiting_.erase(awaiting_.begin());
    messages_.push_back({{"role", "tool"}, {"tool_call_id", call.id}, {"name", call.name}, {"content", user_text}});
    if (!awaiting_.empty()) {
      report.awaits_tool_results = true;
      return report;
    }
  } else {
    messages_.push_back({{"role", "user"}, {"content", user_text}});
  }
  const std::vector<int> prompt = tokenizer_.encode_text(
      render_chat_json(template_, messages_, options_.tools, tokens_, /*add_generation_prompt=*/true), false);
  if (prompt.empty()) throw std::runtime_error("chat template rendered an empty prompt");
  if (static_cast<int>(prompt.size()) >= seq_len_)
    throw std::runtime_error("the conversation (" + std::to_string(prompt.size()) +
                             " tokens) no longer fits the model's context of " + std::to_string(seq_len_));
  if (!engine_) {
    engine_ = std::make_unique<BatchEngine>(*model.llama, chat_engine_options(*model.llama));
    llama_ = model.llama;
  }
  text::TextStream stream(tokenizer_, {}, {});  // the text as the tokens spell it, each piece once final
  auto emit = [&](const std::string& text) {
    report.reply += text;
    if (out && !text.empty()) {
      std::fwrite(text.data(), 1, text.size(), out);
      std::fflush(out);
    }
  };
  report.end = TurnEnd::ContextFull;  // unless the reply ends first
  BatchRequest request;
  request.prompt = prompt;
  request.max_tokens = options_.max_reply_tokens;
  request.temperature = options_.temperature;
  request.topp = options_.topp;
  request.sampling = options_.sampling;
  request.seed = sampler_state_;
  const int id = engine_->add(std::move(request));
  engine_->on_token = [&](int, int next) {
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
  };
  try {
    while (engine_->step()) {
    }
  } catch (...) {
    engine_->on_token = nullptr;  // it refers to this turn
    throw;
  }
  engine_->on_token = nullptr;
  const BatchResult result = engine_->result(id);
  engine_->forget(id);
  if (result.finish_reason == FinishReason::error) throw std::runtime_error(result.error);
  sampler_state_ = result.sampler_state;
  report.start_pos = result.cached_tokens;
  report.fed.assign(prompt.begin() + result.cached_tokens, prompt.end());
  emit(stream.flush());
  if (out) std::fputc('\n', out);

  // The cache now holds the prompt and every reply token fed (the last one picked was not).
  cached_.assign(prompt.begin(), prompt.end());
  cached_.insert(cached_.end(), report.generated.begin(), report.generated.end() - 1);
  add_reply(report);
  return report;
}

// The reply as the conversation's assistant message: with tools, its content and the calls it made
// (their arguments as objects, as templates read them).
void ChatSession::add_reply(TurnReport& report) {
  if (options_.tools.is_null()) {
    messages_.push_back({{"role", "assistant"}, {"content", report.reply}});
    return;
  }
  const text::AssistantReply parsed = text::parse_tool_calls(*template_.tool_format, report.reply, nlohmann::json(options_.tools));
  nlohmann::ordered_json message = {{"role", "assistant"}, {"content", parsed.content}};
  for (const text::ToolCall& call : parsed.tool_calls) {
    report.tool_calls.push_back(call);
    report.tool_calls.back().id = text::tool_call_id(sampler_state_, static_cast<int>(report.tool_calls.size()) - 1);
    message["tool_calls"].push_back({{"id", report.tool_calls.back().id},
                                     {"type", "function"},
                                     {"function", {{"name", call.name}, {"arguments", nlohmann::ordered_json::parse(call.arguments)}}}});
  }
  messages_.push_back(std::move(message));
  awaiting_ = report.tool_calls;
}

std::string_view turn_end_name(TurnEnd end) {
  switch (end) {
    case TurnEnd::EndOfTurn: return "end_of_turn";
    case TurnEnd::ReplyLimit: return "reply_limit";
    case TurnEnd::ContextFull: return "context_full";
  }
  return "?";
}

}  // namespace tpcli::engine
