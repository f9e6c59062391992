// tool_call_grammar: the GBNF an output must follow to be one (or more) calls in a format.
//
// Our rules are named "tc-..." and the arguments' rules "tc<i>-..." (tool i), so that they cannot
// meet the rules the schema compiler writes under the prefixes it is given.
#include <set>
#include <stdexcept>

#include "text/tool_calls.h"

namespace tpcli::text {

namespace {

using json = nlohmann::ordered_json;  // the client's key order: parameters as declared

// A GBNF string literal.
std::string literal(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default: out += c;
    }
  }
  return out + "\"";
}

// A JSON string's text as a GBNF literal: "\"name\"".
std::string json_string_literal(std::string_view text) { return literal(json(std::string(text)).dump()); }

struct Callable {
  std::string name;
  json parameters;
};

std::vector<Callable> callable_tools(const json& tools, std::string_view only_function) {
  std::vector<Callable> callable;
  if (tools.is_array())
    for (const json& tool : tools) {
      const json& function = tool.contains("function") ? tool["function"] : tool;
      if (!function.is_object() || !function.contains("name") || !function["name"].is_string()) continue;
      const std::string name = function["name"].get<std::string>();
      if (!only_function.empty() && name != only_function) continue;
      json parameters = function.contains("parameters") && function["parameters"].is_object() ? function["parameters"]
                                                                                             : json{{"type", "object"}, {"properties", json::object()}};
      callable.push_back({name, std::move(parameters)});
    }
  if (callable.empty())
    throw std::invalid_argument(only_function.empty() ? std::string("tool_call_grammar: no function among the tools")
                                                      : "tool_call_grammar: no tool named \"" + std::string(only_function) + "\"");
  return callable;
}

class GrammarWriter {
 public:
  GrammarWriter(std::vector<Callable> tools, const std::function<std::string(const json&, const std::string&)>& schema_rules)
      : tools_(std::move(tools)), schema_rules_(schema_rules) {}

  void rule(const std::string& name, const std::string& body) { rules_ += name + " ::= " + body + "\n"; }

  // The rule for tool i's arguments as a JSON value of its parameters schema.
  std::string arguments(size_t i) {
    const std::string prefix = "tc" + std::to_string(i) + "-";
    if (!written_arguments_.count(i)) {
      std::string rules = schema_rules_(tools_[i].parameters, prefix);
      if (!rules.empty() && rules.back() != '\n') rules += '\n';
      schema_text_ += rules;
      written_arguments_.insert(i);
    }
    return prefix + "root";
  }

  // A value of property `key` of tool i (schema_rules under its own prefix).
  std::string property_value(size_t i, size_t j, const json& schema) {
    const std::string prefix = "tc" + std::to_string(i) + "-p" + std::to_string(j) + "-";
    std::string rules = schema_rules_(schema, prefix);
    if (!rules.empty() && rules.back() != '\n') rules += '\n';
    schema_text_ += rules;
    return prefix + "root";
  }

  // {"<name_key>": "NAME", "<arguments_key>": ARGS}
  std::string json_call(size_t i, std::string_view name_key, std::string_view arguments_key) {
    return "\"{\" tc-ws " + json_string_literal(name_key) + " tc-ws \":\" tc-ws " + json_string_literal(tools_[i].name) + " tc-ws \",\" tc-ws " +
           json_string_literal(arguments_key) + " tc-ws \":\" tc-ws " + arguments(i) + " tc-ws \"}\"";
  }

  // tc-call ::= one of the tools' calls, each written by `call(i)`.
  void calls(const std::function<std::string(size_t)>& call) {
    std::string alternatives;
    for (size_t i = 0; i < tools_.size(); ++i) {
      rule("tc-call" + std::to_string(i), call(i));
      alternatives += (i ? " | " : "") + std::string("tc-call") + std::to_string(i);
    }
    rule("tc-call", alternatives);
  }

  // Parameters written one by one, `parameter(key, value_rule)` for each property, `separator`
  // between them: any subset, in any order (the schema's `required` is left to the model). With
  // `values_as_text`, a string parameter's value is free text (the XML formats write it unquoted).
  void parameter_calls(const std::function<std::string(size_t, const std::string&)>& call,
                       const std::function<std::string(const std::string&, const std::string&)>& parameter, bool values_as_text,
                       const std::string& separator = "") {
    calls([&](size_t i) {
      const json& properties = tools_[i].parameters.value("properties", json::object());
      std::string alternatives;
      size_t j = 0;
      for (const auto& [key, schema] : properties.items()) {
        const bool text = values_as_text && schema.is_object() && schema.value("type", json()) == "string";
        const std::string value = text ? "tc-text" : property_value(i, j, schema);
        alternatives += (j ? " | " : "") + std::string("( ") + parameter(key, value) + " )";
        ++j;
      }
      const std::string parameters_rule = "tc-params" + std::to_string(i);
      if (alternatives.empty()) rule(parameters_rule, "\"\"");
      else if (separator.empty()) rule(parameters_rule, "( " + alternatives + " )*");
      else rule(parameters_rule, "( ( " + alternatives + " ) ( " + separator + " ( " + alternatives + " ) )* )?");
      return call(i, parameters_rule);
    });
  }

  std::string text() const {
    // Whitespace and text bounded (one space or newline; MAX_TEXT_VALUE characters), as the schema
    // rules bound their whitespace: a model must not be able to run to max_tokens on either. The
    // text is whole blocks, then a shorter tail: at most two readings live at once.
    const std::string text_char = "( [^<] | \"<\" [^/] )";
    return rules_ + "tc-ws ::= ( \" \" | \"\\n\" )?\n" + "tc-text ::= tc-text-block{0," + std::to_string(MAX_TEXT_VALUE / TEXT_VALUE_BLOCK) +
           "} tc-text-tail\n" + "tc-text-block ::= " + text_char + "{" + std::to_string(TEXT_VALUE_BLOCK) + "}\n" + "tc-text-tail ::= " +
           text_char + "{0," + std::to_string(TEXT_VALUE_BLOCK - 1) + "}\n" + schema_text_;
  }

  size_t size() const { return tools_.size(); }
  const std::string& name(size_t i) const { return tools_[i].name; }

 private:
  std::vector<Callable> tools_;
  const std::function<std::string(const json&, const std::string&)>& schema_rules_;
  std::string rules_, schema_text_;
  std::set<size_t> written_arguments_;
};

// root: one call, or (parallel) calls separated by `separator`, between `before` and `after`.
std::string repeated(bool parallel, const std::string& before, const std::string& separator, const std::string& after) {
  std::string body = before.empty() ? "" : before + " ";
  body += "tc-call";
  if (parallel) body += " ( " + separator + " tc-call )*";
  if (!after.empty()) body += " " + after;
  return body;
}

}  // namespace

std::string tool_call_grammar(ToolCallFormat format, const json& tools, std::string_view only_function, bool parallel,
                              const std::function<std::string(const json& schema, const std::string& rule_prefix)>& schema_rules) {
  GrammarWriter g(callable_tools(tools, only_function), schema_rules);
  const auto name = [&](size_t i) { return literal(g.name(i)); };
  std::string root;
  switch (format) {
    case ToolCallFormat::hermes:
      g.calls([&](size_t i) { return "\"<tool_call>\\n\" tc-ws " + g.json_call(i, "name", "arguments") + " tc-ws \"\\n</tool_call>\""; });
      root = repeated(parallel, "", "tc-ws", "");
      break;
    case ToolCallFormat::llama3_json:
      g.calls([&](size_t i) { return g.json_call(i, "name", "parameters"); });
      root = repeated(parallel, "", "tc-ws \";\" tc-ws", "");
      break;
    case ToolCallFormat::mistral:
      // Both forms the parser reads: [TOOL_CALLS][{...}, ...] and [TOOL_CALLS]name[ARGS]{...}[TOOL_CALLS]...
      g.calls([&](size_t i) { return g.json_call(i, "name", "arguments"); });
      {
        std::string named;
        for (size_t i = 0; i < g.size(); ++i) named += (i ? " | " : "") + name(i) + " \"[ARGS]\" " + g.arguments(i);
        g.rule("tc-named", named);
      }
      root = "\"[TOOL_CALLS]\" ( \"[\" tc-ws tc-call" + std::string(parallel ? " ( tc-ws \",\" tc-ws tc-call )*" : "") +
             " tc-ws \"]\" | tc-named" + (parallel ? " ( \"[TOOL_CALLS]\" tc-named )*" : "") + " )";
      break;
    case ToolCallFormat::pythonic:
      g.parameter_calls([&](size_t i, const std::string& params) {
        return name(i) + " \"(\" " + params + " \")\"";
      }, [](const std::string& key, const std::string& value) { return literal(key + "=") + " " + value; }, false, "\", \"");
      root = repeated(parallel, "\"[\"", "\", \"", "\"]\"");
      break;
    case ToolCallFormat::functionary_v3_1:
      g.calls([&](size_t i) { return "\"<function=\" " + name(i) + " \">\" " + g.arguments(i) + " \"</function>\""; });
      root = repeated(parallel, "", "", "");
      break;
    case ToolCallFormat::functionary_v3_2:  // the generation prompt ends with ">>>"
      g.calls([&](size_t i) { return name(i) + " \"\\n\" " + g.arguments(i); });
      root = repeated(parallel, "", "\">>>\"", "");
      break;
    case ToolCallFormat::granite:
    case ToolCallFormat::phi4_mini:
    case ToolCallFormat::firefunction_v2: {
      g.calls([&](size_t i) { return g.json_call(i, "name", "arguments"); });
      const std::string open = format == ToolCallFormat::granite ? "<|tool_call|>[" : format == ToolCallFormat::phi4_mini ? "functools[" : " functools[";
      root = repeated(parallel, literal(open) + " tc-ws", "tc-ws \",\" tc-ws", "tc-ws \"]\"");
      break;
    }
    case ToolCallFormat::deepseek_v3_1:
      g.calls([&](size_t i) {
        return literal("<｜tool▁call▁begin｜>") + " " + name(i) + " " + literal("<｜tool▁sep｜>") + " " + g.arguments(i) + " " + literal("<｜tool▁call▁end｜>");
      });
      root = repeated(parallel, literal("<｜tool▁calls▁begin｜>"), "", literal("<｜tool▁calls▁end｜>"));
      break;
    case ToolCallFormat::qwen3_coder:
      g.parameter_calls([&](size_t i, const std::string& params) {
        return "\"<tool_call>\\n<function=\" " + name(i) + " \">\\n\" " + params + " \"</function>\\n</tool_call>\"";
      }, [](const std::string& key, const std::string& value) { return literal("<parameter=" + key + ">\n") + " " + value + " \"\\n</parameter>\\n\""; }, true);
      root = repeated(parallel, "", "\"\\n\"", "");
      break;
    case ToolCallFormat::command_r:
      g.calls([&](size_t i) { return g.json_call(i, "tool_name", "parameters"); });
      root = repeated(parallel, "\"Action:\\n```json\\n[\" tc-ws", "tc-ws \",\" tc-ws", "tc-ws \"]\\n```\"");
      break;
    case ToolCallFormat::kimi_k2:
      g.calls([&](size_t i) {
        return "\"<|tool_call_begin|>functions.\" " + name(i) + " \":\" [0-9]+ \"<|tool_call_argument_begin|>\" " + g.arguments(i) + " \"<|tool_call_end|>\"";
      });
      root = repeated(parallel, "\"<|tool_calls_section_begin|>\"", "", "\"<|tool_calls_section_end|>\"");
      break;
    case ToolCallFormat::internlm2:
      g.calls([&](size_t i) { return "\"<|action_start|><|plugin|>\\n\" " + g.json_call(i, "name", "parameters") + " \"<|action_end|>\""; });
      root = repeated(parallel, "", "", "");
      break;
    case ToolCallFormat::gpt_oss:  // one call a message; analysis may come first
      g.calls([&](size_t i) {
        return "\"<|channel|>commentary to=functions.\" " + name(i) + " \" <|constrain|>json<|message|>\" " + g.arguments(i) + " \"<|call|>\"";
      });
      g.rule("tc-analysis", "\"<|channel|>analysis<|message|>\" [^<]* \"<|end|><|start|>assistant\"");
      root = "tc-analysis? tc-call";
      break;
    case ToolCallFormat::glm4_5:
      g.parameter_calls([&](size_t i, const std::string& params) { return "\"<tool_call>\" " + name(i) + " \"\\n\" " + params + " \"</tool_call>\""; },
                        [](const std::string& key, const std::string& value) {
                          return literal("<arg_key>" + key + "</arg_key>\n<arg_value>") + " " + value + " \"</arg_value>\\n\"";
                        }, true);
      root = repeated(parallel, "", "\"\\n\"", "");
      break;
    case ToolCallFormat::seed_oss:
      g.parameter_calls([&](size_t i, const std::string& params) {
        return "\"<seed:tool_call>\\n<function=\" " + name(i) + " \">\\n\" " + params + " \"</function>\\n</seed:tool_call>\"";
      }, [](const std::string& key, const std::string& value) { return literal("<parameter=" + key + ">") + " " + value + " \"</parameter>\\n\""; }, true);
      root = repeated(parallel, "", "\"\\n\"", "");
      break;
  }
  return "root ::= " + root + "\n" + g.text();
}

}  // namespace tpcli::text
