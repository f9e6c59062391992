// tpcli::text — Hugging Face chat templates rendered as transformers' apply_chat_template(...,
// tokenize=False) renders them: jinja2's ImmutableSandboxedEnvironment(trim_blocks=True,
// lstrip_blocks=True) with loopcontrols and {% generation %}, transformers' tojson, and the
// globals raise_exception and strftime_now.
//
// The variables are one JSON object, each key a name the template sees, as apply_chat_template
// passes them: `messages`, `tools` (null when none), `documents` (null when none),
// `add_generation_prompt`, the tokenizer's special tokens that have a value (`bos_token`, ...: leave
// a token without one out, so the template sees it undefined), and any extra keyword arguments
// (`enable_thinking`, ...). Object keys keep their order (tojson and dict printing show it).
//
//   const text::JinjaTemplate chat(source);          // parsed once; render as often as needed
//   std::string prompt = chat.render(variables);    // throws text::TemplateError
#pragma once

#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "text/jinja_interpreter.h"
#include "text/jinja_value.h"

namespace tpcli::text {

struct RenderOptions {
  std::optional<std::tm> now;  // what strftime_now() reads; none: the local time at rendering
  RenderLimits limits;
};

class JinjaTemplate {
 public:
  // Throws TemplateError ("template line N: ...") on a syntax error or an unknown filter or test.
  explicit JinjaTemplate(std::string_view source);
  // Throws TemplateError: the template's own raise_exception message, or "template line N: ..." for a
  // failure Python would raise (undefined values in arithmetic, type errors, sandbox limits).
  std::string render(const nlohmann::ordered_json& variables, const RenderOptions& options = {}) const;

 private:
  std::shared_ptr<const Template> template_;
};

std::string render_chat_template(std::string_view source, const nlohmann::ordered_json& variables,
                                 const RenderOptions& options = {});

}  // namespace tpcli::text
