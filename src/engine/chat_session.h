// tpcli::engine — one device's side of a chat: the conversation so far, the tokens whose keys and
// values are in its KV cache, and a turn = render the whole conversation with the chat template,
// feed only the tokens past the part already cached (positions continue), then sample until an
// end-of-turn token or the reply limit, streaming the reply's text.
//
// A turn is a request of the session's batch engine (engine/batch_engine.h), whose prefix cache
// holds every position fed before in blocks of one position: the new prompt reuses the keys and
// values of its longest prefix fed before (all but its last token at most), so with templates that
// render earlier turns the same way (all the supported ones, for replies that re-tokenize to the
// same ids) that is everything fed before; otherwise the positions after the prefix are fed again.
// The sampler is one stream across turns: each turn's request is seeded with the state the last
// one finished in.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include <cstdint>
#include <memory>

#include <nlohmann/json.hpp>

#include "engine/batch_engine.h"
#include "engine/generate.h"
#include "text/chat_template.h"
#include "text/tokenizer_interface.h"

namespace tpcli::engine {

struct ChatOptions {
  std::string system;        // a system message first, when not empty
  int max_reply_tokens = 256;  // tokens generated per reply at most
  float temperature = 1.0f;
  float topp = 0.9f;
  uint64_t seed = 1;
  std::vector<int> more_end_ids;  // tokens that also end a reply (a model's eos ids from its config)
  SamplingParams sampling;        // top_k, min_p, penalties (over the conversation so far, sampling_params.h)
  nlohmann::ordered_json tools;   // an OpenAI tool list the model may call (chat --tools), or null
};

enum class TurnEnd { EndOfTurn, ReplyLimit, ContextFull };

struct TurnReport {
  int start_pos = 0;           // position of the first token fed this turn (= cached positions reused)
  std::vector<int> fed;        // the prompt tokens fed this turn
  std::vector<int> generated;  // the reply's tokens, the end-of-turn token included when it came
  TurnEnd end = TurnEnd::EndOfTurn;
  std::string reply;           // the reply's text (what was streamed)
  std::vector<text::ToolCall> tool_calls;  // with tools: the calls the reply made (their results are the next turns)
  bool awaits_tool_results = false;        // a tool's result was taken and more are awaited: nothing generated
};

class ChatSession {
 public:
  // `model_vocab`: the logits the model returns (>= the tokenizer's ids); `seq_len`: its context.
  // Throws std::invalid_argument when the template's end-of-turn tokens are not in the tokenizer.
  ChatSession(const text::TokenizerInterface& tokenizer, text::ChatTemplate chat_template, text::ChatTokens tokens,
              ChatOptions options, int model_vocab, int seq_len);

  // One user turn on model.llama (the same model every turn); the reply streams to `out` (may be
  // null) followed by a newline. After a reply that called tools, each turn's text is instead the
  // result of the next call (a "tool" message); the model answers once every call has its result.
  // Throws std::runtime_error when the conversation no longer fits the context, or when the logits
  // a reply token comes from are not finite.
  TurnReport turn(const std::string& user_text, const ModelFns& model, std::FILE* out);

  const std::vector<int>& cached() const { return cached_; }

 private:
  bool is_end_of_turn(int id) const;
  void add_reply(TurnReport& report);

  const text::TokenizerInterface& tokenizer_;
  text::ChatTemplate template_;
  text::ChatTokens tokens_;
  ChatOptions options_;
  int model_vocab_, seq_len_;
  uint64_t sampler_state_;            // the next turn's seed: where the last turn's sampler stopped
  std::unique_ptr<BatchEngine> engine_;  // made at the first turn, on its model
  model::Llama* llama_ = nullptr;
  std::vector<int> end_ids_;          // tokens that end the assistant's turn
  nlohmann::ordered_json messages_ = nlohmann::ordered_json::array();
  std::vector<text::ToolCall> awaiting_;  // calls of the last reply still without a result
  std::vector<int> cached_;           // [positions fed] the token at each position of the KV cache
};

std::string_view turn_end_name(TurnEnd end);

}  // namespace tpcli::engine
