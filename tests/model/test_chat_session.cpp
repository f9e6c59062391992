// ChatSession (engine/chat_session.h) on stories260K.bin + tok512.bin with the zephyr template: the
// tokens fed are the template's ids past the cached prefix, positions continue across turns, replies
// stop at EOS or the limit, and turn 2's greedy reply with the KV cache reused equals greedy decoding
// of the whole conversation fed from position 0 into a fresh cache.
#include <catch2/catch.hpp>

#include <algorithm>

#include "engine/chat_session.h"
#include "engine/generate.h"
#include "engine/sampler.h"
#include "formats/llama2c.h"
#include "reference_files.h"
#include "text/tokenizer.h"

using namespace tpcli::model;
using namespace tpcli::engine;
using namespace tpcli::formats;
using namespace tpcli::text;
using tpcli::testing::shared_path;

namespace {

struct Conversation {
  std::vector<TurnReport> turns;
  std::vector<int> cached;
};

Conversation converse(const WeightSource& weights, const Tokenizer& tokenizer, const std::vector<std::string>& lines,
                      int reply_tokens, float temperature = 0.0f, uint64_t seed = 1, int devices = 1) {
  Conversation c;
  run_model_on_mesh(weights, tpcli::dist::Mesh::line(devices), [&](const ModelFns& model, std::FILE* out) {
    ChatSession session(tokenizer, chat_template_named("zephyr"), {"<s>", "</s>"},
                        {.max_reply_tokens = reply_tokens, .temperature = temperature, .topp = 0.9f, .seed = seed},
                        weights.config().vocab_size, weights.config().seq_len);
    Conversation mine;
    for (const auto& line : lines) mine.turns.push_back(session.turn(line, model, nullptr));
    mine.cached = session.cached();
    if (out) c = mine;
    GenerateResult r;
    r.tokens = mine.cached;  // every device's, compared
    return r;
  }, stdout);
  return c;
}

// Greedy picks after each of `tokens`, fed from position 0 into a fresh model.
std::vector<int> greedy_after_each(const WeightSource& weights, const std::vector<int>& tokens) {
  std::vector<int> picks;
  run_model_on_mesh(weights, tpcli::dist::Mesh::line(1), [&](const ModelFns& model, std::FILE*) {
    for (size_t pos = 0; pos < tokens.size(); ++pos) picks.push_back(model.argmax(tokens[pos], static_cast<int>(pos)));
    return GenerateResult{};
  }, nullptr);
  return picks;
}

// Llama2.c's decode with one sampler over the whole conversation: each turn's prompt fed from
// position 0 into the model's own cache, then `lengths[t]` picks, each fed before the next.
std::vector<std::vector<int>> sampled_replies(const WeightSource& weights, const std::vector<std::vector<int>>& prompts,
                                              const std::vector<size_t>& lengths, float temperature, uint64_t seed) {
  std::vector<std::vector<int>> replies;
  run_model_on_mesh(weights, tpcli::dist::Mesh::line(1), [&](const ModelFns& model, std::FILE*) {
    Sampler sampler(weights.config().vocab_size, temperature, 0.9f, seed);
    for (size_t t = 0; t < prompts.size(); ++t) {
      std::span<const float> logits;
      int pos = 0;
      for (int token : prompts[t]) logits = model.forward(token, pos++);
      std::vector<int> reply;
      while (reply.size() < lengths[t]) {
        std::vector<float> copy(logits.begin(), logits.end());
        reply.push_back(sampler.sample(copy));
        if (reply.size() < lengths[t]) logits = model.forward(reply.back(), pos++);
      }
      replies.push_back(std::move(reply));
    }
    return GenerateResult{};
  }, nullptr);
  return replies;
}

}  // namespace

TEST_CASE("chat session: template ids fed past the cached prefix, positions continue, cached reply = fresh greedy") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  Llama2cFile weights(shared_path("data/stories260K.bin"));
  Tokenizer tokenizer(shared_path("data/tok512.bin"), weights.config().vocab_size);
  const std::vector<std::string> lines{"Tell me about a cat.", "What did the dog do?"};
  const Conversation c = converse(weights, tokenizer, lines, 24);
  REQUIRE(c.turns.size() == 2);
  const ChatTokens tokens{"<s>", "</s>"};
  const ChatTemplate zephyr = chat_template_named("zephyr");

  // Turn 1: the whole rendered prompt from position 0.
  std::vector<ChatMessage> messages{{"user", lines[0]}};
  CHECK(c.turns[0].start_pos == 0);
  CHECK(c.turns[0].fed == tokenizer.encode_text(render_chat(zephyr, messages, tokens, true), false));
  for (const TurnReport& t : c.turns) {
    REQUIRE(!t.generated.empty());
    CHECK(t.generated.size() <= 24);
    if (t.end == TurnEnd::EndOfTurn) CHECK(t.generated.back() == EOS_TOKEN);
    if (t.end == TurnEnd::ReplyLimit) CHECK(t.generated.size() == 24);
    CHECK(t.end != TurnEnd::ContextFull);
    const bool ended = t.end == TurnEnd::EndOfTurn;
    CHECK(t.reply == tokenizer.decode_ids(std::span(t.generated).first(t.generated.size() - (ended ? 1 : 0))));
  }

  // Turn 2: the conversation re-rendered; what was cached (turn 1's prompt and reply but its last
  // pick) is reused up to the common prefix, which covers at least turn 1's whole prompt.
  messages.push_back({"assistant", c.turns[0].reply});
  messages.push_back({"user", lines[1]});
  const std::vector<int> prompt2 = tokenizer.encode_text(render_chat(zephyr, messages, tokens, true), false);
  std::vector<int> cached1 = c.turns[0].fed;
  cached1.insert(cached1.end(), c.turns[0].generated.begin(), c.turns[0].generated.end() - 1);
  const size_t common = std::mismatch(prompt2.begin(), prompt2.end(), cached1.begin(), cached1.end()).first - prompt2.begin();
  CHECK(static_cast<size_t>(c.turns[1].start_pos) == common);
  CHECK(common >= c.turns[0].fed.size());
  CHECK(c.turns[1].fed == std::vector<int>(prompt2.begin() + static_cast<long>(common), prompt2.end()));

  // The reply of turn 2 equals greedy decoding of prompt2 + reply from scratch.
  std::vector<int> whole = prompt2;
  whole.insert(whole.end(), c.turns[1].generated.begin(), c.turns[1].generated.end() - 1);
  const std::vector<int> picks = greedy_after_each(weights, whole);
  for (size_t k = 0; k < c.turns[1].generated.size(); ++k)
    CHECK(picks[prompt2.size() - 1 + k] == c.turns[1].generated[k]);
}

TEST_CASE("chat session: a template whose end-of-turn token the tokenizer lacks is an error") {
  TPCLI_REQUIRE_SHARED("data/tok512.bin");
  Tokenizer tokenizer(shared_path("data/tok512.bin"), 512);
  CHECK_THROWS_WITH(ChatSession(tokenizer, chat_template_named("llama3"), {"<s>", "</s>"}, {}, 512, 512),
                    Catch::Contains("<|eot_id|>"));
}

TEST_CASE("chat session: a seeded conversation picks what one sampler over llama2.c's decode picks, turn after turn, on 1 and 2 devices") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  Llama2cFile weights(shared_path("data/stories260K.bin"));
  Tokenizer tokenizer(shared_path("data/tok512.bin"), weights.config().vocab_size);
  const std::vector<std::string> lines{"Tell me about a cat.", "What did the dog do?", "And then?"};
  const ChatTokens tokens{"<s>", "</s>"};
  const ChatTemplate zephyr = chat_template_named("zephyr");
  for (int devices : {1, 2}) {
    INFO(devices << " devices");
    const Conversation c = converse(weights, tokenizer, lines, 20, 0.9f, 77, devices);
    REQUIRE(c.turns.size() == 3);
    std::vector<ChatMessage> messages;
    std::vector<std::vector<int>> prompts;
    std::vector<size_t> lengths;
    for (size_t t = 0; t < lines.size(); ++t) {
      messages.push_back({"user", lines[t]});
      prompts.push_back(tokenizer.encode_text(render_chat(zephyr, messages, tokens, true), false));
      lengths.push_back(c.turns[t].generated.size());
      messages.push_back({"assistant", c.turns[t].reply});
      CHECK(c.turns[t].start_pos + c.turns[t].fed.size() == prompts[t].size());
    }
    CHECK(c.turns[1].start_pos > 0);  // the earlier turns' keys and values were reused
    CHECK(c.turns[2].start_pos > c.turns[1].start_pos);
    const std::vector<std::vector<int>> expected = sampled_replies(weights, prompts, lengths, 0.9f, 77);
    for (size_t t = 0; t < lines.size(); ++t) CHECK(c.turns[t].generated == expected[t]);
  }
}

TEST_CASE("chat session: tools reach the template, and a template that writes no tool calls refuses them") {
  TPCLI_REQUIRE_SHARED("data/stories260K.bin");
  Llama2cFile weights(shared_path("data/stories260K.bin"));
  const Tokenizer tokenizer(shared_path("data/tok512.bin"), weights.config().vocab_size);
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(
      R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
  const ChatOptions with_tools{.max_reply_tokens = 4, .temperature = 0.0f, .topp = 0.9f, .seed = 1, .tools = tools};
  CHECK_THROWS_WITH(ChatSession(tokenizer, chat_template_named("zephyr"), {"<s>", "</s>"}, with_tools, weights.config().vocab_size,
                                weights.config().seq_len),
                    Catch::Contains("writes no tool calls"));
  std::string prompt;
  run_model_on_mesh(weights, tpcli::dist::Mesh::line(1), [&](const ModelFns& model, std::FILE* out) {
    // Hermes's way with tools, in a template the 512-token vocabulary can end.
    const ChatTemplate hermes_like = chat_template_from_source(
        "{%- if tools %}<tools>{% for t in tools %}{{ t.function | tojson }}{% endfor %}</tools>{% endif %}"
        "{%- for m in messages %}{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}"
        "{% else %}<|{{ m.role }}|>{{ m.content }}</s>{% endif %}{% endfor %}<|assistant|>",
        "hermes-like");
    ChatSession session(tokenizer, hermes_like, {"<s>", "</s>"}, with_tools, weights.config().vocab_size, weights.config().seq_len);
    const TurnReport report = session.turn("Weather in Paris?", model, nullptr);
    if (out) prompt = tokenizer.decode_ids(report.fed, false);
    return GenerateResult{};
  }, stdout);
  CHECK(prompt.find("<tools>") != std::string::npos);
  CHECK(prompt.find("\"name\": \"get_weather\"") != std::string::npos);
}
