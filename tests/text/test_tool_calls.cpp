// Tool calls out of generated text (text/tool_calls.h): model outputs written here by hand, in each
// format as its model card / chat template shows it, parse to the calls written next to them; the
// published chat templates' own renderings of assistant tool calls parse back to the calls rendered;
// every output, fed in pieces of every size, streams to the same reply; the grammars are well formed.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/shared_data.h"
#include "text/chat_template.h"
#include "text/tool_calls.h"

namespace fs = std::filesystem;
using nlohmann::json;
using nlohmann::ordered_json;
using tpcli::text::AssistantReply;
using tpcli::text::parse_tool_calls;
using tpcli::text::ToolCallFormat;
using tpcli::text::ToolCallStream;

namespace {

struct ExpectedCall {
  std::string name;
  std::string arguments;  // JSON text, compared as parsed JSON
};

struct Case {
  ToolCallFormat format;
  std::string output;
  std::string content;
  std::vector<ExpectedCall> calls;
};

std::string describe(const AssistantReply& reply) {
  std::string s = "content " + ordered_json(reply.content).dump() + ", calls [";
  for (const auto& c : reply.tool_calls) s += c.name + " " + c.arguments + "; ";
  return s + "]";
}

void check_reply(const AssistantReply& got, const std::string& content, const std::vector<ExpectedCall>& calls) {
  INFO("got " << describe(got));
  CHECK(got.content == content);
  REQUIRE(got.tool_calls.size() == calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    CHECK(got.tool_calls[i].name == calls[i].name);
    CHECK(got.tool_calls[i].id.empty());
    const json arguments = json::parse(got.tool_calls[i].arguments, nullptr, false);
    REQUIRE(arguments.is_object());
    CHECK(arguments == json::parse(calls[i].arguments));
    CHECK(got.tool_calls[i].arguments == ordered_json::parse(got.tool_calls[i].arguments).dump());  // compact
  }
}

using F = ToolCallFormat;

// Outputs as each model writes them (the call syntax of its chat template / model card), and the
// reply they must give. Malformed calls stay content as written.
std::vector<Case> cases() {
  return {
      // hermes (Hermes 2/3, Qwen2.5, Qwen3, QwQ)
      {F::hermes, "Hello there!", "Hello there!", {}},
      {F::hermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", "",
       {{"get_weather", R"({"city": "Paris"})"}}},
      {F::hermes,
       "Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": {\"y\": [1, 2, {\"z\": null}]}}}\n</tool_call>\n"
       "<tool_call>\n{\"name\": \"b\", \"arguments\": {\"q\": \"Zürich \\\"quoted\\\" 👋\"}}\n</tool_call>",
       "Let me check.", {{"a", R"({"x": {"y": [1, 2, {"z": null}]}})"}, {"b", R"({"q": "Zürich \"quoted\" 👋"})"}}},
      {F::hermes, "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\nDone, see above.", "Done, see above.", {{"a", "{}"}}},
      {F::hermes, "<tool_call>{\"name\": \"a\", \"arguments\": {\"k\": 1}}", "", {{"a", R"({"k": 1})"}}},  // stopped before the closer
      {F::hermes, "<tool_call>{\"name\": \"a\", \"arguments\": {\"k\": </tool_call> ok", "<tool_call>{\"name\": \"a\", \"arguments\": {\"k\": </tool_call> ok", {}},
      {F::hermes, "<tool_call>{\"name\": \"a\", \"arguments\": \"{\\\"k\\\": 2}\"}</tool_call>", "", {{"a", R"({"k": 2})"}}},
      {F::hermes, "<tool_call>{\"name\": \"a\", \"arguments\": [1]}</tool_call>", "<tool_call>{\"name\": \"a\", \"arguments\": [1]}</tool_call>", {}},
      {F::hermes, "a < b and <tool_ is not a call", "a < b and <tool_ is not a call", {}},
      // llama3_json (Llama 3.1/3.2/3.3/4 with JSON tools)
      {F::llama3_json, R"({"name": "get_weather", "parameters": {"city": "Paris", "days": 3}})", "", {{"get_weather", R"({"city": "Paris", "days": 3})"}}},
      {F::llama3_json, R"(<|python_tag|>{"name": "a", "parameters": {"u": "é"}}; {"name": "b", "parameters": {}})", "",
       {{"a", R"({"u": "é"})"}, {"b", "{}"}}},
      {F::llama3_json, "  {\"name\": \"a\", \"arguments\": {\"n\": [true, false]}}\n", "", {{"a", R"({"n": [true, false]})"}}},
      {F::llama3_json, "<|python_tag|>brave_search.call(query=\"weather in Paris\")", "", {{"brave_search", R"({"query": "weather in Paris"})"}}},
      {F::llama3_json, "<|python_tag|>import math\nprint(math.pi)<|eom_id|>", "", {{"python", R"j({"code": "import math\nprint(math.pi)"})j"}}},
      {F::llama3_json, "The JSON is {\"name\": \"a\", \"parameters\": {}}", "The JSON is {\"name\": \"a\", \"parameters\": {}}", {}},
      {F::llama3_json, "{\"name\": \"a\", \"parameters\": {\"x\": 1}", "{\"name\": \"a\", \"parameters\": {\"x\": 1}", {}},
      {F::llama3_json, "{\"key\": \"value\"}", "{\"key\": \"value\"}", {}},
      // mistral: the JSON list (Mistral 7B v0.3, vLLM's template) and name[ARGS] (Devstral, Mistral Small 3.2)
      {F::mistral, R"([TOOL_CALLS] [{"name": "a", "arguments": {"x": "y"}}, {"name": "b", "arguments": {"n": 1.5}}])", "",
       {{"a", R"({"x": "y"})"}, {"b", R"({"n": 1.5})"}}},
      {F::mistral, R"(Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{})", "Sure.",
       {{"get_weather", R"({"city": "Paris"})"}, {"get_time", "{}"}}},
      {F::mistral, R"([TOOL_CALLS]search[CALL_ID]a1B2c3D4e[ARGS]{"q": "x \"y\"", "o": {"deep": [1, {"k": null}]}})", "",
       {{"search", R"({"q": "x \"y\"", "o": {"deep": [1, {"k": null}]}})"}}},
      {F::mistral, "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"x\": }]", "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"x\": }]", {}},
      {F::mistral, "Use [brackets] freely.", "Use [brackets] freely.", {}},
      // pythonic (Llama 3.2/4 pythonic, Gemma 3, LFM2)
      {F::pythonic, R"([get_weather(city="Paris", days=3), get_time()])", "", {{"get_weather", R"({"city": "Paris", "days": 3})"}, {"get_time", "{}"}}},
      {F::pythonic, R"([f(a=True, b=None, c=[1, 'two', 3.5], d={'k': False, "n": (1, 2)}, e='it\'s', g=-2e-3)])", "",
       {{"f", R"({"a": true, "b": null, "c": [1, "two", 3.5], "d": {"k": false, "n": [1, 2]}, "e": "it's", "g": -0.002})"}}},
      {F::pythonic, "Let me look.[lookup(q=\"Zürich 👋 \\\"x\\\"\")]", "Let me look.", {{"lookup", R"({"q": "Zürich 👋 \"x\""})"}}},
      {F::pythonic, "<|python_start|>[a(x=1)]<|python_end|>", "", {{"a", R"({"x": 1})"}}},
      {F::pythonic, "<|tool_call_start|>[a.b(x='y')]<|tool_call_end|>Checking.", "Checking.", {{"a.b", R"({"x": "y"})"}}},
      {F::pythonic, "See [1] and [link](http://x) or [f(1)].", "See [1] and [link](http://x) or [f(1)].", {}},
      {F::pythonic, "[f(a=)]", "[f(a=)]", {}},
      // functionary v3.1 (Llama 3.1 based)
      {F::functionary_v3_1, R"(<function=get_weather>{"city": "Paris"}</function>)", "", {{"get_weather", R"({"city": "Paris"})"}}},
      {F::functionary_v3_1, "I'll check both.<function=a>{\"x\": [1]}</function><function=b>{}</function>", "I'll check both.",
       {{"a", R"({"x": [1]})"}, {"b", "{}"}}},
      {F::functionary_v3_1, "<|python_tag|>print(1 + 1)", "", {{"python", R"j({"code": "print(1 + 1)"})j"}}},
      {F::functionary_v3_1, "<function=a>{bad}</function>", "<function=a>{bad}</function>", {}},
      // functionary v3.2: the generation prompt ends with ">>>"
      {F::functionary_v3_2, "get_weather\n{\"city\": \"Paris\"}", "", {{"get_weather", R"({"city": "Paris"})"}}},
      {F::functionary_v3_2, "all\nLet me check.\n>>>a\n{\"x\": 1}>>>b\n{\"y\": \"z\"}", "Let me check.", {{"a", R"({"x": 1})"}, {"b", R"({"y": "z"})"}}},
      {F::functionary_v3_2, "all\nJust text, no calls.", "Just text, no calls.", {}},
      // granite
      {F::granite, "<|tool_call|>[{\"name\": \"a\", \"arguments\": {\"x\": 1}}, {\"name\": \"b\", \"arguments\": {}}]", "", {{"a", R"({"x": 1})"}, {"b", "{}"}}},
      {F::granite, "Sure! <|tool_call|>[{\"name\": \"a\", \"arguments\": {\"s\": \"ü\"}}]", "Sure!", {{"a", R"({"s": "ü"})"}}},
      // phi4_mini and firefunction v2
      {F::phi4_mini, R"(functools[{"name": "a", "arguments": {"x": [1, 2]}}, {"name": "b", "arguments": {}}])", "", {{"a", R"({"x": [1, 2]})"}, {"b", "{}"}}},
      {F::firefunction_v2, R"(Calling. functools[{"name": "a", "arguments": {"loc": "Rome, Italy"}}])", "Calling.", {{"a", R"({"loc": "Rome, Italy"})"}}},
      {F::firefunction_v2, "functools[{\"name\": \"a\"", "functools[{\"name\": \"a\"", {}},
      // DeepSeek V3.1, and V3 / R1's older inner form
      {F::deepseek_v3_1, "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>a<｜tool▁sep｜>{\"x\": 1}<｜tool▁call▁end｜><｜tool▁call▁begin｜>b<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
       "Checking.", {{"a", R"({"x": 1})"}, {"b", "{}"}}},
      {F::deepseek_v3_1, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"北京\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
       "", {{"get_weather", R"({"city": "北京"})"}}},
      // Qwen3-Coder
      {F::qwen3_coder, "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis, France\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
       "", {{"get_weather", R"({"city": "Paris, France", "days": 3})"}}},
      {F::qwen3_coder, "Two calls.\n<tool_call>\n<function=a>\n<parameter=o>\n{\"k\": [1, \"x\"]}\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=b>\n</function>\n</tool_call>",
       "Two calls.", {{"a", R"({"o": {"k": [1, "x"]}})"}, {"b", "{}"}}},
      // Command R+
      {F::command_r, "I will look it up.\nAction:\n```json\n[\n    {\n        \"tool_name\": \"internet_search\",\n        \"parameters\": {\n            \"query\": \"weather\"\n        }\n    }\n]\n```",
       "I will look it up.", {{"internet_search", R"({"query": "weather"})"}}},
      // Kimi K2
      {F::kimi_k2, "<|tool_calls_section_begin|><|tool_call_begin|>functions.a:0<|tool_call_argument_begin|>{\"x\": \"y\"}<|tool_call_end|><|tool_call_begin|>functions.b:1<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>",
       "", {{"a", R"({"x": "y"})"}, {"b", "{}"}}},
      // InternLM2
      {F::internlm2, "Sure.<|action_start|><|plugin|>\n{\"name\": \"a\", \"parameters\": {\"x\": 2}}<|action_end|>", "Sure.", {{"a", R"({"x": 2})"}}},
      // gpt-oss (harmony)
      {F::gpt_oss, "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>",
       "", {{"get_weather", R"({"city": "Paris"})"}}},
      {F::gpt_oss, "<|channel|>analysis<|message|>Simple.<|end|><|start|>assistant<|channel|>final<|message|>Hello, world!", "Hello, world!", {}},
      {F::gpt_oss, " to=functions.a<|channel|>commentary json<|message|>{\"n\": [1]}<|call|>", "", {{"a", R"({"n": [1]})"}}},
      {F::gpt_oss, "<|channel|>commentary<|message|>Checking both.<|end|><|start|>assistant<|channel|>commentary to=functions.a <|constrain|>json"
                   "<|message|>{}<|call|><|start|>assistant<|channel|>commentary to=functions.b <|constrain|>json<|message|>\"{\\\"k\\\": 1}\"<|call|>",
       "Checking both.", {{"a", "{}"}, {"b", R"({"k": 1})"}}},
      {F::gpt_oss, "<|channel|>final<|message|>No tools needed.<|return|>", "No tools needed.", {}},
      // GLM-4.5 / 4.6
      {F::glm4_5, "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris, France</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
       "", {{"get_weather", R"({"city": "Paris, France", "days": 3})"}}},
      // Seed-OSS
      {F::seed_oss, "Checking.\n<seed:tool_call>\n<function=a>\n<parameter=x>hello world</parameter>\n</function>\n</seed:tool_call>", "Checking.",
       {{"a", R"({"x": "hello world"})"}}},
  };
}

std::string format_label(ToolCallFormat f) { return tpcli::text::tool_call_format_name(f); }

// ---- streaming ----

AssistantReply stream_in_pieces(ToolCallFormat format, const std::string& text, const std::vector<size_t>& cuts, const json& tools = nullptr) {
  ToolCallStream stream(format, tools);
  AssistantReply reply;
  std::map<int, size_t> position;
  auto take = [&](tpcli::text::ReplyDelta delta) {
    reply.content += delta.content;
    for (auto& d : delta.tool_calls) {
      if (!position.count(d.index)) {
        REQUIRE(!d.name.empty());
        REQUIRE(d.index == static_cast<int>(reply.tool_calls.size()));
        position[d.index] = reply.tool_calls.size();
        reply.tool_calls.push_back({"", d.name, ""});
      } else {
        REQUIRE(d.name.empty());
      }
      reply.tool_calls[position[d.index]].arguments += d.arguments_fragment;
    }
  };
  size_t from = 0;
  for (size_t cut : cuts) {
    take(stream.feed(std::string_view(text).substr(from, cut - from)));
    from = cut;
  }
  take(stream.feed(std::string_view(text).substr(from)));
  take(stream.finish());
  return reply;
}

// Cuts that split `text` into pieces of `size` bytes.
std::vector<size_t> fixed_cuts(size_t length, size_t size) {
  std::vector<size_t> cuts;
  for (size_t at = size; at < length; at += size) cuts.push_back(at);
  return cuts;
}

// Cuts where a tokenizer would: before and after every special-looking marker, at spaces and punctuation.
std::vector<size_t> token_like_cuts(const std::string& text) {
  std::vector<size_t> cuts;
  static const std::regex TOKEN(R"(<\|[^|]*\|>|<｜[^｜]*｜>|\[[A-Z_]+\]|\s+|[A-Za-z]+|[0-9]|.)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), TOKEN); it != std::sregex_iterator(); ++it)
    if (it->position() > 0) cuts.push_back(static_cast<size_t>(it->position()));
  return cuts;
}

void check_streams_like_whole(ToolCallFormat format, const std::string& text, const json& tools = nullptr) {
  const AssistantReply whole = parse_tool_calls(format, text, tools);
  std::vector<std::pair<std::string, std::vector<size_t>>> splits = {{"whole", {}}, {"tokens", token_like_cuts(text)}};
  for (size_t size : {1, 2, 3, 5}) splits.push_back({std::to_string(size) + " bytes", fixed_cuts(text.size(), size)});
  std::mt19937 rng(7);
  for (int r = 0; r < 8; ++r) {
    std::vector<size_t> cuts;
    for (size_t at = 0;;) {
      at += std::uniform_int_distribution<size_t>(1, 12)(rng);
      if (at >= text.size()) break;
      cuts.push_back(at);
    }
    splits.push_back({"random " + std::to_string(r), cuts});
  }
  for (const auto& [label, cuts] : splits) {
    INFO(format_label(format) << " in pieces: " << label << "; text " << ordered_json(text).dump());
    const AssistantReply streamed = stream_in_pieces(format, text, cuts, tools);
    CHECK(streamed.content == whole.content);
    REQUIRE(streamed.tool_calls.size() == whole.tool_calls.size());
    for (size_t i = 0; i < whole.tool_calls.size(); ++i) {
      CHECK(streamed.tool_calls[i].name == whole.tool_calls[i].name);
      CHECK(streamed.tool_calls[i].arguments == whole.tool_calls[i].arguments);
    }
  }
}

}  // namespace

TEST_CASE("tool calls: each format's outputs parse to the calls written next to them") {
  for (const Case& c : cases()) {
    INFO(format_label(c.format) << ": " << ordered_json(c.output).dump());
    check_reply(parse_tool_calls(c.format, c.output), c.content, c.calls);
  }
}

TEST_CASE("tool calls: text in any format without a call is the content, trimmed") {
  for (int f = 0; f <= static_cast<int>(ToolCallFormat::seed_oss); ++f) {
    const auto format = static_cast<ToolCallFormat>(f);
    INFO(format_label(format));
    check_reply(parse_tool_calls(format, "  The answer is 42.\n\nSecond paragraph: a < b, [x] {y}.  \n"),
                "The answer is 42.\n\nSecond paragraph: a < b, [x] {y}.", {});
  }
}

TEST_CASE("tool calls: the XML formats type values by the tool's schema") {
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
      "properties": {"zip": {"type": "string"}, "n": {"type": "integer"}, "o": {"type": "object"}}}}}])");
  const std::string qwen = "<tool_call>\n<function=f>\n<parameter=zip>\n01234\n</parameter>\n<parameter=n>\n7\n</parameter>\n"
                           "<parameter=o>\n{\"a\": true}\n</parameter>\n</function>\n</tool_call>";
  check_reply(parse_tool_calls(ToolCallFormat::qwen3_coder, qwen, tools), "", {{"f", R"({"zip": "01234", "n": 7, "o": {"a": true}})"}});
  const std::string glm = "<tool_call>f\n<arg_key>zip</arg_key>\n<arg_value>123</arg_value>\n</tool_call>";
  check_reply(parse_tool_calls(ToolCallFormat::glm4_5, glm, tools), "", {{"f", R"({"zip": "123"})"}});
  check_reply(parse_tool_calls(ToolCallFormat::glm4_5, glm), "", {{"f", R"({"zip": 123})"}});  // no schema: JSON where it parses
  const std::string undeclared = "<tool_call>f\n<arg_key>extra</arg_key>\n<arg_value>42</arg_value>\n</tool_call>";
  check_reply(parse_tool_calls(ToolCallFormat::glm4_5, undeclared, tools), "", {{"f", R"({"extra": "42"})"}});  // not in the schema: text
}

TEST_CASE("tool calls: every output streams, in pieces of every size, to the reply parsed whole") {
  for (const Case& c : cases()) check_streams_like_whole(c.format, c.output);
}

TEST_CASE("tool calls: a long argument (a file's text) streams like the whole, in linear time") {
  std::string file;
  for (int line = 0; line < 2000; ++line) file += "line " + std::to_string(line) + ": {\"braces\": [1, 2]} é\n";
  const std::string escaped = ordered_json(file).dump();
  const std::vector<std::pair<ToolCallFormat, std::string>> outputs = {
      {F::hermes, "Writing.<tool_call>{\"name\": \"write\", \"arguments\": {\"text\": " + escaped + "}}</tool_call>"},
      {F::mistral, "[TOOL_CALLS]write[ARGS]{\"text\": " + escaped + "}[TOOL_CALLS]write[ARGS]{\"text\": \"short\"}"},
      {F::qwen3_coder, "<tool_call>\n<function=write>\n<parameter=text>\n" + file + "\n</parameter>\n</function>\n</tool_call>"},
  };
  for (const auto& [format, output] : outputs) {
    INFO(format_label(format));
    const AssistantReply whole = parse_tool_calls(format, output);
    REQUIRE(!whole.tool_calls.empty());
    CHECK(ordered_json::parse(whole.tool_calls[0].arguments)["text"] == file);
    for (size_t piece : {1, 3, 7}) {
      const AssistantReply streamed = stream_in_pieces(format, output, fixed_cuts(output.size(), piece));
      CHECK(streamed.content == whole.content);
      REQUIRE(streamed.tool_calls.size() == whole.tool_calls.size());
      for (size_t i = 0; i < whole.tool_calls.size(); ++i) CHECK(streamed.tool_calls[i].arguments == whole.tool_calls[i].arguments);
    }
  }
}

TEST_CASE("tool calls: a stream releases content before a call is complete, and holds back only a possible marker") {
  ToolCallStream stream(ToolCallFormat::hermes);
  CHECK(stream.feed("Let me check the weather ").content == "Let me check the weather");
  CHECK(stream.feed("<tool").content.empty());
  auto delta = stream.feed("_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>");
  REQUIRE(delta.tool_calls.size() == 1);
  CHECK(delta.tool_calls[0].name == "a");
  CHECK(delta.tool_calls[0].index == 0);
  CHECK(stream.finish().empty());

  ToolCallStream text_only(ToolCallFormat::hermes);
  CHECK(text_only.feed("a <b").content == "a <b");  // "<b" cannot start "<tool_call>"
  CHECK(text_only.feed(" <tool").content.empty());     // "<tool" can, and the space before it is content only if more follows
  CHECK(text_only.feed("box>").content == " <toolbox>");

  // Text for the user streams as it comes in the formats that mark it: harmony's final channel, functionary's ">>>all".
  ToolCallStream harmony(ToolCallFormat::gpt_oss);
  CHECK(harmony.feed("<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Hel").content == "Hel");
  CHECK(harmony.feed("lo!<|ret").content == "lo!");
  CHECK(harmony.feed("urn|>").empty());
  CHECK(harmony.finish().empty());
  ToolCallStream functionary(ToolCallFormat::functionary_v3_2);
  CHECK(functionary.feed("all\nSure, ").content == "Sure,");
  CHECK(functionary.feed("one moment.").content == " one moment.");

  ToolCallStream utf8(ToolCallFormat::mistral);
  const std::string wave = "👋";
  CHECK(utf8.feed("hi " + wave.substr(0, 2)).content == "hi ");  // never half a character
  CHECK(utf8.feed(wave.substr(2)).content == wave);
}

TEST_CASE("tool calls: ids are call_ + 24 letters or digits, a function of seed and index") {
  const std::string id = tpcli::text::tool_call_id(42, 0);
  CHECK(std::regex_match(id, std::regex("call_[A-Za-z0-9]{24}")));
  CHECK(id == tpcli::text::tool_call_id(42, 0));
  CHECK(id != tpcli::text::tool_call_id(42, 1));
  CHECK(id != tpcli::text::tool_call_id(43, 0));
}

TEST_CASE("tool calls: format names") {
  for (const char* name : {"hermes", "llama3_json", "mistral", "pythonic", "granite", "phi4_mini_json", "internlm", "kimi_k2", "qwen3_coder",
                           "deepseek_v31", "openai", "glm45", "seed_oss", "functionary_v3_1", "functionary_v3_2", "firefunction_v2", "command_r"}) {
    INFO(name);
    const auto format = tpcli::text::tool_call_format_named(name);
    REQUIRE(format);
    CHECK(tpcli::text::tool_call_format_name(*format) == name);
    CHECK(tpcli::text::tool_call_format_names().find(name) != std::string::npos);
  }
  CHECK(!tpcli::text::tool_call_format_named("nope"));
}

// ---- the published templates ----

namespace {

const char* const TEMPLATES = "reference/chat-templates/templates";

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// What each published template renders assistant tool calls as (read off each template by hand).
const std::map<std::string, std::optional<ToolCallFormat>>& template_formats() {
  static const std::map<std::string, std::optional<ToolCallFormat>> formats = {
      {"ByteDance-Seed-OSS", F::seed_oss},
      {"CohereForAI-c4ai-command-r-plus-tool_use", F::command_r},
      {"GLM-4.6", F::glm4_5},
      {"HuggingFaceTB-SmolLM3-3B", std::nullopt},
      {"LFM2-8B-A1B", F::pythonic},  // lists tools; its model writes <|tool_call_start|>[f(...)]<|tool_call_end|>
      {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use", F::hermes},
      {"NousResearch-Meta-Llama-3-8B", std::nullopt},
      {"Qwen-QwQ-32B", F::hermes},
      {"Qwen-Qwen2.5-7B-Instruct", F::hermes},
      {"Qwen-Qwen3-4B", F::hermes},
      {"Qwen3-Coder", F::qwen3_coder},
      {"deepseek-ai-DeepSeek-V3.1", F::deepseek_v3_1},
      {"fireworks-ai-llama-3-firefunction-v2", F::firefunction_v2},
      {"meetkai-functionary-medium-v3.1", F::functionary_v3_1},
      {"meetkai-functionary-medium-v3.2", F::functionary_v3_2},
      {"meta-llama-Llama-3.1-8B-Instruct", F::llama3_json},
      {"meta-llama-Llama-3.2-3B-Instruct", F::llama3_json},
      {"microsoft-Phi-3.5-mini-instruct", std::nullopt},
      {"moonshotai-Kimi-K2", F::kimi_k2},
      {"openai-gpt-oss-120b", F::gpt_oss},
      {"unsloth-mistral-Devstral-Small-2507", F::mistral},
      {"vllm-tool_chat_template_gemma3_pythonic", F::pythonic},
      {"vllm-tool_chat_template_granite", F::granite},
      {"vllm-tool_chat_template_internlm2_tool", F::internlm2},
      {"vllm-tool_chat_template_llama3.2_pythonic", F::pythonic},
      {"vllm-tool_chat_template_llama4_pythonic", F::pythonic},
      {"vllm-tool_chat_template_mistral_parallel", F::mistral},
      {"vllm-tool_chat_template_phi4_mini", F::phi4_mini},
  };
  return formats;
}

const json& round_trip_tools() {
  // Every property described and every function's `required` given: Command R+'s template reads them.
  static const json tools = json::parse(R"([
    {"type": "function", "function": {"name": "get_current_weather", "description": "Get the weather",
      "parameters": {"type": "object", "properties": {"location": {"type": "string", "description": "City"},
                     "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Unit"}}, "required": ["location"]}}},
    {"type": "function", "function": {"name": "search_flights", "description": "Find flights",
      "parameters": {"type": "object", "properties": {"origin": {"type": "string", "description": "From"},
                     "passengers": {"type": "object", "description": "Who", "additionalProperties": {"type": "integer"}},
                     "max_stops": {"type": "integer", "description": "Stops"}, "note": {"type": "string", "description": "Note"}},
                     "required": ["origin"]}}},
    {"type": "function", "function": {"name": "get_time", "description": "UTC time", "parameters": {"type": "object", "properties": {}, "required": []}}},
    {"type": "function", "function": {"name": "roll_dice", "description": "Dice", "parameters": {"type": "object",
      "properties": {"sides": {"type": "integer", "description": "Sides"}, "count": {"type": "integer", "description": "Dice"}},
      "required": ["sides"]}}}
  ])");
  return tools;
}

struct CallSet {
  std::string label;
  std::string content;
  std::vector<ExpectedCall> calls;
};

std::vector<CallSet> call_sets() {
  return {
      {"one string argument", "", {{"get_current_weather", R"({"location": "Paris, France"})"}}},
      {"two arguments", "", {{"get_current_weather", R"({"location": "Tokyo, Japan", "unit": "celsius"})"}}},
      {"nested and unicode", "",
       {{"search_flights", R"({"origin": "Zürich \"ZRH\"", "passengers": {"adults": 2, "ages": [7, 9]}, "max_stops": 1, "note": "👋 ok"})"}}},
      {"no arguments", "", {{"get_time", "{}"}}},
      {"integers only", "", {{"roll_dice", R"({"sides": 20, "count": 2})"}}},
      {"parallel", "", {{"get_current_weather", R"({"location": "Paris, France"})"}, {"get_time", "{}"}, {"roll_dice", R"({"sides": 6, "count": 1})"}}},
  };
}

// Renderings that do not show the model's format, left out with the reason (templates' own bugs).
bool renders_faithfully(const std::string& name, const CallSet& set) {
  if (name == "LFM2-8B-A1B") return false;  // renders an assistant message's tool_calls as nothing
  if (name == "openai-gpt-oss-120b") return set.label != "parallel";  // renders a message's first call only
  if (name == "vllm-tool_chat_template_llama4_pythonic")  // quotes every value as written: f(n="1", o="{'a': 2}", s="say "hi"")
    return set.label == "one string argument" || set.label == "two arguments" || set.label == "no arguments";
  if (name == "vllm-tool_chat_template_gemma3_pythonic")  // joins keyword arguments without a comma: f(a="x"b="y")
    return set.label == "one string argument" || set.label == "no arguments";
  if (name == "vllm-tool_chat_template_llama3.2_pythonic")  // writes string values unquoted: f(location=Paris, France)
    return set.label == "no arguments" || set.label == "integers only";
  return true;
}

// The messages of `set` with arguments as objects, or as JSON strings (templates that concatenate them).
ordered_json assistant_messages(const CallSet& set, bool arguments_as_text) {
  ordered_json calls = ordered_json::array();
  const char* const ids[] = {"Ab3Cd4Ef5", "Gh6Ij7Kl8", "Mn9Op0Qr1"};
  for (size_t i = 0; i < set.calls.size(); ++i) {
    const ordered_json arguments = ordered_json::parse(set.calls[i].arguments);
    calls.push_back({{"id", ids[i]}, {"type", "function"},
                     {"function", {{"name", set.calls[i].name}, {"arguments", arguments_as_text ? ordered_json(arguments.dump()) : arguments}}}});
  }
  return ordered_json::array({{{"role", "user"}, {"content", "Please use the tools."}},
                              {{"role", "assistant"}, {"content", set.content}, {"tool_calls", calls}}});
}

// The assistant's text in `full`: after the generation prompt, up to the end of its turn. The
// generation prompt is found by its end (Command R+ puts a system turn between the user's message and
// it, which the rendered history has elsewhere), else by what prompt and history share up to the last
// line (QwQ's prompt opens "<think>\n", which the history's turn lacks).
std::string assistant_turn(const std::string& user_text, const std::string& prompt, const std::string& full,
                           const std::vector<std::string>& end_markers) {
  const size_t user_in_prompt = prompt.rfind(user_text) + user_text.size();
  const size_t user_in_full = full.rfind(user_text) + user_text.size();
  const std::string generation = prompt.substr(user_in_prompt);
  size_t start = std::string::npos;
  for (size_t k = generation.size(); k >= 12 && start == std::string::npos; --k) {
    const size_t at = full.find(generation.substr(generation.size() - k), user_in_full);
    if (at != std::string::npos) start = at + k;
  }
  if (start == std::string::npos) {
    size_t common = 0;
    while (common < generation.size() && user_in_full + common < full.size() && generation[common] == full[user_in_full + common]) ++common;
    start = full.rfind('\n', user_in_full + common - 1) + 1;
  }
  std::string turn = full.substr(start);
  size_t end = turn.size();
  for (const auto& marker : end_markers) end = std::min(end, turn.find(marker));
  return turn.substr(0, end);
}

}  // namespace

TEST_CASE("tool calls: Llama 3.1's rendering of a built-in tool's call parses back to it") {
  TPCLI_REQUIRE_SHARED(TEMPLATES);
  const std::string name = "meta-llama-Llama-3.1-8B-Instruct";
  tpcli::text::ChatTemplate chat =
      tpcli::text::chat_template_from_source(read_text(tpcli::testing::shared_path(TEMPLATES) + "/" + name + ".jinja"), name);
  chat.extra = {{"builtin_tools", {"brave_search", "wolfram_alpha"}}};
  const ordered_json messages = ordered_json::parse(R"([{"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "brave_search", "arguments": {"query": "Paris weather \u00e9t\u00e9"}}}]}])");
  const std::string full = tpcli::text::render_chat_json(chat, messages, nullptr, {"<|begin_of_text|>", "<|eot_id|>"}, false);
  const size_t tag = full.rfind("<|start_header_id|>assistant<|end_header_id|>\n\n");
  REQUIRE(tag != std::string::npos);
  const std::string turn = full.substr(tag + 47, full.find("<|eom_id|>", tag) - tag - 47);
  INFO(turn);
  check_reply(parse_tool_calls(ToolCallFormat::llama3_json, turn), "", {{"brave_search", R"({"query": "Paris weather été"})"}});
}

TEST_CASE("tool calls: the format each published template writes calls in is read off its source") {
  TPCLI_REQUIRE_SHARED(TEMPLATES);
  size_t seen = 0;
  for (const auto& entry : fs::directory_iterator(tpcli::testing::shared_path(TEMPLATES))) {
    if (entry.path().extension() != ".jinja") continue;
    const std::string name = entry.path().stem().string();
    INFO(name);
    REQUIRE(template_formats().count(name));
    CHECK(tpcli::text::tool_call_format_of_template(read_text(entry.path())) == template_formats().at(name));
    ++seen;
  }
  CHECK(seen == template_formats().size());
}

TEST_CASE("tool calls: each published template's rendering of assistant tool calls parses back to those calls") {
  TPCLI_REQUIRE_SHARED(TEMPLATES);
  const std::vector<std::string> extra_end_markers = {"<|eom_id|>", "<|eot|>", "<seed:eos>", "<|end_of_text|>", "</s>", "<｜end▁of▁sentence｜>",
                                                      "<|observation|>", "<|call|>", "<|im_end|>"};
  size_t round_trips = 0;
  for (const auto& [name, format] : template_formats()) {
    if (!format) continue;
    const fs::path path = tpcli::testing::shared_path(TEMPLATES) + "/" + name + ".jinja";
    const json meta = json::parse(read_text(fs::path(path).replace_extension(".json")));
    tpcli::text::ChatTemplate chat = tpcli::text::chat_template_from_source(read_text(path), name);
    if (name == "fireworks-ai-llama-3-firefunction-v2")  // takes its tools as keyword arguments (as the reference case does)
      chat.extra = {{"functions", round_trip_tools().dump(4)}, {"datetime", "2026-07-26"}};
    const tpcli::text::ChatTokens tokens{meta.value("bos_token", json()).is_string() ? meta["bos_token"].get<std::string>() : "",
                                         meta.value("eos_token", json()).is_string() ? meta["eos_token"].get<std::string>() : ""};
    std::vector<std::string> end_markers = tpcli::text::end_of_turn_tokens(chat, tokens);
    end_markers.insert(end_markers.end(), extra_end_markers.begin(), extra_end_markers.end());
    size_t template_round_trips = 0;
    for (const CallSet& set : call_sets()) {
      if (!renders_faithfully(name, set)) continue;
      const ordered_json tools = ordered_json::parse(round_trip_tools().dump());
      std::string full;
      for (bool as_text : {false, true}) {  // some templates take arguments as objects, some as JSON text
        try {
          full = tpcli::text::render_chat_json(chat, assistant_messages(set, as_text), tools, tokens, false);
          break;
        } catch (const std::exception&) {
          // the template refuses this message (one call at a time, ...): try the other shape, or skip the set
        }
      }
      if (full.empty()) continue;
      const ordered_json user_only = ordered_json::array({assistant_messages(set, false)[0]});
      const std::string prompt = tpcli::text::render_chat_json(chat, user_only, tools, tokens, true);
      const std::string turn = assistant_turn("Please use the tools.", prompt, full, end_markers);
      INFO(name << ", " << set.label << ": the assistant's turn " << ordered_json(turn).dump());
      const AssistantReply reply = parse_tool_calls(*format, turn, round_trip_tools());
      INFO("got " << describe(reply));
      REQUIRE(reply.tool_calls.size() == set.calls.size());
      for (size_t i = 0; i < set.calls.size(); ++i) {
        CHECK(reply.tool_calls[i].name == set.calls[i].name);
        CHECK(json::parse(reply.tool_calls[i].arguments) == json::parse(set.calls[i].arguments));
      }
      check_streams_like_whole(*format, turn, round_trip_tools());
      ++template_round_trips;
    }
    INFO(name);
    if (name != "LFM2-8B-A1B") CHECK(template_round_trips > 0);  // every template with tools renders some calls faithfully
    round_trips += template_round_trips;
  }
  CHECK(round_trips > 60);
}

// ---- grammars ----

namespace {

// A stand-in for the JSON-schema compiler: any JSON object (nested braces, strings with braces).
std::string any_object_rules(const json&, const std::string& prefix) {
  return prefix + "root ::= \"{\" " + prefix + "inner \"}\"\n" + prefix + "inner ::= ( [^{}\"] | " + prefix + "string | \"{\" " + prefix +
         "inner \"}\" )*\n" + prefix + "string ::= \"\\\"\" ( [^\"\\\\] | \"\\\\\" [^\\n] )* \"\\\"\"\n";
}

// GBNF as llama.cpp reads it, one rule a line: every rule defined once, every rule used defined,
// literals and classes closed, parentheses balanced, `root` present. The literals, for the caller.
std::vector<std::string> check_gbnf(const std::string& grammar) {
  std::set<std::string> defined, used;
  std::vector<std::string> literals;
  std::istringstream lines(grammar);
  static const std::regex RULE(R"(^([a-zA-Z0-9-]+) ::= (.+)$)");
  for (std::string line; std::getline(lines, line);) {
    if (line.empty()) continue;
    INFO("rule: " << line);
    std::smatch m;
    REQUIRE(std::regex_match(line, m, RULE));
    CHECK(defined.insert(m[1]).second);
    const std::string body = m[2];
    int depth = 0;
    for (size_t i = 0; i < body.size();) {
      const char c = body[i];
      if (c == ' ') {
        ++i;
      } else if (c == '"' || c == '[') {
        const char close = c == '"' ? '"' : ']';
        std::string text;
        size_t j = i + 1;
        for (; j < body.size() && body[j] != close; ++j) {
          if (body[j] == '\\') ++j;
          text += body[j];
        }
        REQUIRE(j < body.size());  // closed
        if (c == '"') literals.push_back(text);
        i = j + 1;
      } else if (c == '(' || c == ')') {
        depth += c == '(' ? 1 : -1;
        REQUIRE(depth >= 0);
        ++i;
      } else if (c == '|' || c == '*' || c == '+' || c == '?') {
        ++i;
      } else if (c == '{') {  // {m}, {m,} or {m,n}
        const size_t j = body.find('}', i);
        REQUIRE(j != std::string::npos);
        static const std::regex COUNT(R"(\{[0-9]+(,[0-9]*)?\})");
        CHECK(std::regex_match(body.substr(i, j + 1 - i), COUNT));
        i = j + 1;
      } else {
        size_t j = i;
        while (j < body.size() && (std::isalnum(static_cast<unsigned char>(body[j])) || body[j] == '-')) ++j;
        REQUIRE(j > i);  // nothing but names, literals, classes and operators
        used.insert(body.substr(i, j - i));
        i = j;
      }
    }
    CHECK(depth == 0);
  }
  CHECK(defined.count("root"));
  for (const auto& name : used) {
    INFO("rule used: " << name);
    CHECK(defined.count(name));
  }
  return literals;
}

}  // namespace

TEST_CASE("tool calls: each format's grammar is well formed GBNF naming the tools it may call") {
  const json tools = json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}])");
  for (int f = 0; f <= static_cast<int>(ToolCallFormat::seed_oss); ++f) {
    const auto format = static_cast<ToolCallFormat>(f);
    for (bool parallel : {false, true}) {
      for (std::string only : {"", "get_time"}) {
        const std::string grammar = tpcli::text::tool_call_grammar(format, tools, only, parallel, any_object_rules);
        INFO(format_label(format) << (parallel ? ", parallel" : "") << ", only " << only << ":\n" << grammar);
        const std::vector<std::string> literals = check_gbnf(grammar);
        const auto names = [&](const std::string& name) {
          for (const auto& l : literals)
            if (l.find(name) != std::string::npos) return true;
          return false;
        };
        CHECK(names("get_time"));
        CHECK(names("get_weather") == only.empty());
      }
    }
  }
  CHECK_THROWS_AS(tpcli::text::tool_call_grammar(ToolCallFormat::hermes, tools, "nope", false, any_object_rules), std::invalid_argument);
  CHECK_THROWS_AS(tpcli::text::tool_call_grammar(ToolCallFormat::hermes, json::array(), "", false, any_object_rules), std::invalid_argument);
}

namespace {

// A small stand-in schema compiler: a string, an integer, or a flat object (no recursion, so the
// grammar can become one regular expression below).
std::string flat_value_rules(const json& schema, const std::string& prefix) {
  const std::string type = schema.value("type", "object");
  if (type == "string") return prefix + "root ::= \"\\\"\" [^\"]* \"\\\"\"\n";
  if (type == "integer") return prefix + "root ::= [0-9]+\n";
  return prefix + "root ::= \"{\" [^{}]* \"}\"\n";
}

// A grammar without recursion as an ECMAScript regular expression: each rule inlined.
std::string gbnf_to_regex(const std::map<std::string, std::string>& rules, const std::string& name, int depth = 0) {
  REQUIRE(depth < 20);  // no recursion
  const std::string& body = rules.at(name);
  std::string out;
  for (size_t i = 0; i < body.size();) {
    const char c = body[i];
    if (c == ' ') {
      ++i;
    } else if (c == '"') {
      std::string text;
      size_t j = i + 1;
      for (; body[j] != '"'; ++j) {
        if (body[j] == '\\') {
          ++j;
          text += body[j] == 'n' ? '\n' : body[j] == 't' ? '\t' : body[j] == 'r' ? '\r' : body[j];
        } else {
          text += body[j];
        }
      }
      out += "(?:";
      for (char t : text) {
        if (std::string_view("\\^$.|?*+()[]{}/").find(t) != std::string_view::npos) out += '\\';
        out += t;
      }
      out += ")";
      i = j + 1;
    } else if (c == '[') {
      size_t j = i + 1;
      for (; body[j] != ']'; ++j)
        if (body[j] == '\\') ++j;
      out += body.substr(i, j + 1 - i);
      i = j + 1;
    } else if (c == '(') {
      out += "(?:", ++i;
    } else if (std::string_view(")|*+?").find(c) != std::string_view::npos) {
      out += c, ++i;
    } else if (c == '{') {  // {m}, {m,} or {m,n}: ECMAScript's own, but a long {0,n} as *: std::regex
      const size_t j = body.find('}', i);  // copies its NFA per count (the text values' bound is
      const std::string count = body.substr(i, j + 1 - i);  // checked by the real matcher in tests/grammar)
      const size_t comma = count.find(',');
      out += count.starts_with("{0,") && std::isdigit(static_cast<unsigned char>(count[comma + 1])) && std::stoi(count.substr(comma + 1)) > 32 ? "*" : count;
      i = j + 1;
    } else {
      size_t j = i;
      while (j < body.size() && (std::isalnum(static_cast<unsigned char>(body[j])) || body[j] == '-')) ++j;
      out += "(?:" + gbnf_to_regex(rules, body.substr(i, j - i), depth + 1) + ")";
      i = j;
    }
  }
  return out;
}

std::map<std::string, std::string> gbnf_rules(const std::string& grammar) {
  std::map<std::string, std::string> rules;
  std::istringstream lines(grammar);
  for (std::string line; std::getline(lines, line);)
    if (const size_t at = line.find(" ::= "); at != std::string::npos) rules[line.substr(0, at)] = line.substr(at + 5);
  return rules;
}

bool grammar_allows(const std::string& grammar, const std::string& text) {
  return std::regex_match(text, std::regex(gbnf_to_regex(gbnf_rules(grammar), "root")));
}

}  // namespace

TEST_CASE("tool calls: what each format's grammar allows is what its parser reads") {
  const json tools = json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}])");
  const std::vector<ExpectedCall> two_calls = {{"get_weather", R"({"city": "Paris", "days": 3})"}, {"get_time", "{}"}};
  // Two calls as each model writes them (and as the grammar spells them).
  const std::vector<std::pair<ToolCallFormat, std::string>> outputs = {
      {F::hermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>\n"
                  "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>"},
      {F::llama3_json, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"days\": 3}}; {\"name\": \"get_time\", \"parameters\": {}}"},
      {F::mistral, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}, {\"name\": \"get_time\", \"arguments\": {}}]"},
      {F::mistral, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\", \"days\": 3}[TOOL_CALLS]get_time[ARGS]{}"},
      {F::pythonic, "[get_weather(city=\"Paris\", days=3), get_time()]"},
      {F::functionary_v3_1, "<function=get_weather>{\"city\": \"Paris\", \"days\": 3}</function><function=get_time>{}</function>"},
      {F::functionary_v3_2, "get_weather\n{\"city\": \"Paris\", \"days\": 3}>>>get_time\n{}"},
      {F::granite, "<|tool_call|>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}, {\"name\": \"get_time\", \"arguments\": {}}]"},
      {F::phi4_mini, "functools[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}, {\"name\": \"get_time\", \"arguments\": {}}]"},
      {F::firefunction_v2, " functools[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}, {\"name\": \"get_time\", \"arguments\": {}}]"},
      {F::deepseek_v3_1, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\", \"days\": 3}<｜tool▁call▁end｜>"
                         "<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"},
      {F::qwen3_coder, "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n"
                       "<tool_call>\n<function=get_time>\n</function>\n</tool_call>"},
      {F::command_r, "Action:\n```json\n[{\"tool_name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"days\": 3}}, {\"tool_name\": \"get_time\", \"parameters\": {}}]\n```"},
      {F::kimi_k2, "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\", \"days\": 3}<|tool_call_end|>"
                   "<|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>"},
      {F::internlm2, "<|action_start|><|plugin|>\n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"days\": 3}}<|action_end|>"
                     "<|action_start|><|plugin|>\n{\"name\": \"get_time\", \"parameters\": {}}<|action_end|>"},
      {F::glm4_5, "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>\n"
                  "<tool_call>get_time\n</tool_call>"},
      {F::seed_oss, "<seed:tool_call>\n<function=get_weather>\n<parameter=city>Paris</parameter>\n<parameter=days>3</parameter>\n</function>\n</seed:tool_call>\n"
                    "<seed:tool_call>\n<function=get_time>\n</function>\n</seed:tool_call>"},
  };
  std::set<ToolCallFormat> covered;
  for (const auto& [format, output] : outputs) {
    INFO(format_label(format) << ": " << ordered_json(output).dump());
    check_reply(parse_tool_calls(format, output, tools), "", two_calls);
    const std::string parallel = tpcli::text::tool_call_grammar(format, tools, "", true, flat_value_rules);
    INFO(parallel);
    CHECK(grammar_allows(parallel, output));
    CHECK(!grammar_allows(parallel, output + "x"));
    CHECK(!grammar_allows(tpcli::text::tool_call_grammar(format, tools, "", false, flat_value_rules), output));  // two calls: not one
    CHECK(!grammar_allows(tpcli::text::tool_call_grammar(format, tools, "get_time", true, flat_value_rules), output));  // names get_weather
    covered.insert(format);
  }
  // gpt-oss calls one function a message.
  const std::string harmony = "<|channel|>analysis<|message|>Weather needed.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
                              "<|constrain|>json<|message|>{\"city\": \"Paris\", \"days\": 3}<|call|>";
  check_reply(parse_tool_calls(F::gpt_oss, harmony, tools), "", {two_calls[0]});
  CHECK(grammar_allows(tpcli::text::tool_call_grammar(F::gpt_oss, tools, "", true, flat_value_rules), harmony));
  covered.insert(F::gpt_oss);
  CHECK(covered.size() == static_cast<size_t>(ToolCallFormat::seed_oss) + 1);
}

TEST_CASE("tool calls: random mixes of markers, brackets and text never throw, and stream like the whole") {
  // Pieces of every format's syntax, so that random texts hit half-open calls, markers inside values, ...
  const std::vector<std::string> pieces = {
      "<tool_call>", "</tool_call>", "{\"name\": \"f\", \"arguments\": {\"a\": 1}}", "{", "}", "[", "]", "(", ")", "\"", "'", "\\", ",", ";",
      "\n", " ", "text", "é👋", "<|python_tag|>", "[TOOL_CALLS]", "[ARGS]", "f(a=1)", "functools", "<function=f>", "</function>", ">>>",
      "all\n", "<|tool_call|>", "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>",
      "<｜tool▁calls▁end｜>", "<parameter=a>", "</parameter>", "Action:", "```json", "```", "<|tool_calls_section_begin|>",
      "<|tool_call_begin|>functions.f:0", "<|tool_call_argument_begin|>", "<|tool_call_end|>", "<|tool_calls_section_end|>",
      "<|action_start|><|plugin|>", "<|action_end|>", "<|start|>assistant", "<|channel|>final", "<|channel|>analysis", " to=functions.f",
      "<|message|>", "<|end|>", "<|call|>", "<arg_key>a</arg_key>", "<arg_value>1</arg_value>", "<seed:tool_call>", "</seed:tool_call>", "f\n",
      "\"parameters\": {}", "<|python_start|>", "<|python_end|>", "True", "None", "1e-07", "=", ":"};
  std::mt19937 rng(2026);
  for (int f = 0; f <= static_cast<int>(ToolCallFormat::seed_oss); ++f) {
    const auto format = static_cast<ToolCallFormat>(f);
    for (int n = 0; n < 1000; ++n) {
      std::string text;
      const int count = std::uniform_int_distribution<int>(1, 24)(rng);
      for (int k = 0; k < count; ++k) text += pieces[std::uniform_int_distribution<size_t>(0, pieces.size() - 1)(rng)];
      INFO(format_label(format) << ": " << ordered_json(text).dump());
      REQUIRE_NOTHROW(parse_tool_calls(format, text));
      const AssistantReply reply = parse_tool_calls(format, text);
      for (const auto& call : reply.tool_calls) CHECK(json::parse(call.arguments, nullptr, false).is_object());
      check_streams_like_whole(format, text);
    }
  }
}
