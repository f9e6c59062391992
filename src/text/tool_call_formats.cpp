// Which Syntax each format has (the formats themselves: tool_call_formats_{json,special,xml}.cpp).
#include <map>

#include "text/tool_call_syntax.h"

namespace tpcli::text::tool_syntax {

const Syntax& syntax_of(ToolCallFormat format) {
  static const std::map<ToolCallFormat, Syntax> SYNTAXES = {
      {ToolCallFormat::hermes, hermes_syntax()},
      {ToolCallFormat::llama3_json, llama3_json_syntax()},
      {ToolCallFormat::mistral, mistral_syntax()},
      {ToolCallFormat::pythonic, pythonic_syntax()},
      {ToolCallFormat::functionary_v3_1, functionary_v3_1_syntax()},
      {ToolCallFormat::functionary_v3_2, functionary_v3_2_syntax()},
      {ToolCallFormat::granite, granite_syntax()},
      {ToolCallFormat::phi4_mini, functools_syntax(true)},
      {ToolCallFormat::firefunction_v2, functools_syntax(false)},
      {ToolCallFormat::deepseek_v3_1, deepseek_v3_1_syntax()},
      {ToolCallFormat::qwen3_coder, qwen3_coder_syntax()},
      {ToolCallFormat::command_r, command_r_syntax()},
      {ToolCallFormat::kimi_k2, kimi_k2_syntax()},
      {ToolCallFormat::internlm2, internlm2_syntax()},
      {ToolCallFormat::gpt_oss, gpt_oss_syntax()},
      {ToolCallFormat::glm4_5, glm4_5_syntax()},
      {ToolCallFormat::seed_oss, seed_oss_syntax()},
  };
  return SYNTAXES.at(format);
}

}  // namespace tpcli::text::tool_syntax
