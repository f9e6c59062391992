#include "text/jinja_template.h"

#include <chrono>

#include <nlohmann/json.hpp>

#include "text/jinja_builtins.h"
#include "text/jinja_parser.h"

namespace tpcli::text {

namespace {

std::tm local_now() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm now{};
  localtime_r(&t, &now);
  return now;
}

}  // namespace

JinjaTemplate::JinjaTemplate(std::string_view source) {
  try {
    auto parsed = std::make_shared<Template>(parse_template(source));
    check_names(*parsed);
    template_ = std::move(parsed);
  } catch (const TemplateError&) {
    throw;
  } catch (const std::exception& e) {  // a library failure while parsing: still one TemplateError
    throw TemplateError(std::string("template failed to parse: ") + e.what());
  }
}

std::string JinjaTemplate::render(const nlohmann::ordered_json& variables, const RenderOptions& options) const {
  if (!variables.is_object()) throw TemplateError("chat template variables must be a JSON object");
  std::unordered_map<std::string, Value> names;
  for (const auto& [key, value] : variables.items()) names[key] = from_json(value);
  ObjectArena arena;  // declared first: it outlives the globals and values that hold its objects
  const auto globals = builtin_globals(options.now ? *options.now : local_now(), arena);
  return render_template(*template_, names, globals, options.limits, arena);
}

std::string render_chat_template(std::string_view source, const nlohmann::ordered_json& variables,
                                 const RenderOptions& options) {
  return JinjaTemplate(source).render(variables, options);
}

}  // namespace tpcli::text
