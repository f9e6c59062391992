// tpcli::text — a model's generated text as OpenAI tool calls, in the tool-call format its chat
// template trains it to write (the rendering of an assistant message with `tool_calls` is exactly
// that text), for every format the published templates use:
//
//   hermes            <tool_call>{"name": ..., "arguments": {...}}</tool_call>         (Hermes, Qwen2.5/3, QwQ)
//   llama3_json       {"name": ..., "parameters": {...}}  or  <|python_tag|>{...}     (Llama 3.1/3.2/4 JSON)
//   mistral           [TOOL_CALLS][{"name", "arguments"}, ...]  or  [TOOL_CALLS]name[ARGS]{...}
//   pythonic          [f(a=1, b="x"), g()]                                             (Llama 3.2/4, Gemma 3, LFM2)
//   functionary_v3_1  <function=name>{...}</function>
//   functionary_v3_2  >>>name\n{...}
//   granite           <|tool_call|>[{"name", "arguments"}, ...]
//   phi4_mini         functools[{"name", "arguments"}, ...]
//   firefunction_v2    functools[{"name", "arguments"}, ...]
//   deepseek_v3_1     <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>name<｜tool▁sep｜>{...}<｜tool▁call▁end｜>...
//   qwen3_coder       <tool_call><function=name><parameter=k>v</parameter></function></tool_call>
//   command_r         Action: ```json [{"tool_name", "parameters"}]```
//   kimi_k2           <|tool_calls_section_begin|><|tool_call_begin|>functions.name:0<|tool_call_argument_begin|>{...}...
//   internlm2         <|action_start|><|plugin|>{"name", "parameters"}<|action_end|>
//   gpt_oss           harmony: <|channel|>commentary to=functions.name <|constrain|>json<|message|>{...}<|call|>
//   glm4_5            <tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>
//   seed_oss          <seed:tool_call><function=name><parameter=k>v</parameter></function></seed:tool_call>
//
// The text outside calls is the reply's content: each stretch of it trimmed, stretches on either
// side of a call joined by one newline. A call that does not parse (bad JSON, arguments that are not
// an object) stays in the content as written, as vLLM's parsers leave it; nothing here throws.
// Harmony (gpt_oss) marks its reasoning: the analysis channel is left out of the content, the final
// channel and commentary preambles are content. Other models' reasoning (<think>...</think>) is not
// told apart here: split it off first, as vLLM runs its reasoning parser before the tool parser (a
// call written inside the reasoning would otherwise count).
//
//   text::ToolCallStream stream(text::ToolCallFormat::hermes);
//   for (piece : detokenized) send(stream.feed(piece));   // content and whole calls, as soon as final
//   send(stream.finish());
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace tpcli::text {

enum class ToolCallFormat {
  hermes,
  llama3_json,
  mistral,
  pythonic,
  functionary_v3_1,
  functionary_v3_2,
  granite,
  phi4_mini,
  firefunction_v2,
  deepseek_v3_1,
  qwen3_coder,
  command_r,
  kimi_k2,
  internlm2,
  gpt_oss,
  glm4_5,
  seed_oss,
};

struct ToolCall {
  std::string id;         // "call_" + 24 characters (tool_call_id), or empty where the caller numbers them
  std::string name;
  std::string arguments;  // a JSON object as compact text, keys in the model's order, as OpenAI sends it
};

// The --tool-parser names: vLLM's where it has one (hermes, llama3_json, mistral, pythonic, granite,
// phi4_mini_json, internlm, kimi_k2, qwen3_coder, deepseek_v31, openai, glm45, seed_oss), plus
// llama.cpp's for the rest (functionary_v3_1, functionary_v3_2, firefunction_v2, command_r); the
// enumerators' own spellings are accepted too.
std::optional<ToolCallFormat> tool_call_format_named(std::string_view name);
std::string tool_call_format_name(ToolCallFormat format);  // the canonical --tool-parser name
std::string tool_call_format_names();                      // every canonical name, for messages
// The format a chat template's source writes its assistant tool calls in (the markers it renders:
// "<tool_call>", "[TOOL_CALLS]", "<|python_tag|>", ...); nullopt when it renders no tool calls.
std::optional<ToolCallFormat> tool_call_format_of_template(std::string_view jinja_source);

// "call_" + 24 letters and digits, a function of (seed, index) only: the server passes the
// request's seed and the call's position in the reply.
std::string tool_call_id(uint64_t seed, int index);

struct AssistantReply {
  std::string content;               // the text outside tool calls
  std::vector<ToolCall> tool_calls;  // ids left empty: the caller numbers them
};

// `tools` (OpenAI's tool list, or null) types the values of the XML formats (qwen3_coder, glm4_5,
// seed_oss), which write every argument as text: a parameter its schema declares a string stays
// text, any other value is read as JSON where it parses.
AssistantReply parse_tool_calls(ToolCallFormat format, std::string_view generated, const nlohmann::json& tools = nullptr);

struct ToolCallDelta {
  int index = 0;
  std::string name;                // non-empty only in a call's first delta
  std::string arguments_fragment;  // joined over a call's deltas: its arguments
};
struct ReplyDelta {
  std::string content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return content.empty() && tool_calls.empty(); }
};

// Streaming: text arrives piece by piece (what the detokenizer released); each feed returns what is
// final so far, holding back text that may still turn out to be (part of) a call, and content up to
// a UTF-8 character boundary; finish() flushes. The deltas joined equal parse_tool_calls(whole
// text), however the text was split (parse_tool_calls is this stream fed once).
class ToolCallStream {
 public:
  explicit ToolCallStream(ToolCallFormat format, const nlohmann::json& tools = nullptr);
  ~ToolCallStream();
  ToolCallStream(ToolCallStream&&) noexcept;
  ToolCallStream& operator=(ToolCallStream&&) noexcept;

  ReplyDelta feed(std::string_view text);
  ReplyDelta finish();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// The GBNF grammar (llama.cpp's dialect, start rule `root`, one rule a line) an output must follow
// when the client sets tool_choice "required" or names a function: one call (one or more when
// `parallel`) in `format`, naming one of `tools` (OpenAI's [{"type": "function", "function": {"name",
// "description", "parameters"}}]; only `only_function` when not empty), whose arguments follow that
// tool's parameters schema. schema_rules(parameters, prefix) returns GBNF rules for a JSON value of
// that schema with entry rule `<prefix>root` (the JSON-schema compiler); the formats that write
// arguments as text or Python keywords (pythonic, qwen3_coder, glm4_5, seed_oss) constrain the
// parameter names to the schema's properties and the values to text / Python literals instead.
// The tools keep the client's key order (an ordered_json, as serve parses bodies), so parameters
// come in the order they were declared. A string value written as text (the XML formats) is
// bounded (MAX_TEXT_VALUE), as the schema compiler bounds whitespace: a model cannot run to
// max_tokens inside it. Throws std::invalid_argument when no tool is left to call.
std::string tool_call_grammar(ToolCallFormat format, const nlohmann::ordered_json& tools, std::string_view only_function, bool parallel,
                              const std::function<std::string(const nlohmann::ordered_json& schema, const std::string& rule_prefix)>& schema_rules);

// The longest text value the grammar allows, in characters (a "<" and the character after it count
// one): room for a long argument (a small file, ~2-3k tokens), written in blocks of TEXT_VALUE_BLOCK
// so that the automaton holds two blocks' states (~10k) instead of one per character (a single
// {0,8191} would take ~320k, past the compiler's bound of 200k).
constexpr int TEXT_VALUE_BLOCK = 128;
constexpr int MAX_TEXT_VALUE = 64 * TEXT_VALUE_BLOCK - 1;

}  // namespace tpcli::text
