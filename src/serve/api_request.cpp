// tpcli::serve — OpenAI request bodies (see api_request.h).
#include "serve/api_request.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>

namespace tpcli::serve {

using json = nlohmann::ordered_json;  // the client's key order

ApiError::ApiError(int status, std::string message, std::string param, std::string code, std::string type)
    : std::runtime_error(std::move(message)),
      status_(status),
      param_(std::move(param)),
      code_(std::move(code)),
      type_(type.empty() ? (status == 401 ? "authentication_error" : status >= 500 ? "server_error" : "invalid_request_error")
                         : std::move(type)) {}

nlohmann::json ApiError::body() const {
  const auto or_null = [](const std::string& s) { return s.empty() ? json(nullptr) : json(s); };
  return {{"error", {{"message", what()}, {"type", type_}, {"param", or_null(param_)}, {"code", or_null(code_)}}}};
}

namespace {

ApiError bad(const std::string& param, const std::string& message, const std::string& code = {}) {
  return ApiError(400, message, param, code);
}

// nlohmann's tree builder behind a count of values and a depth, fed by its SAX parser: a body
// past either bound is refused as soon as the parser meets it, before its tree grows (an empty
// object costs ~80 bytes built from 3 of text). Not nlohmann's parser callback: it scans the
// parent container after each object or array, quadratic in a list of them.
template <class Json>
class BoundedTree {
 public:
  explicit BoundedTree(Json& out) : dom_(out, true) {}
  bool null() { return counted() && dom_.null(); }
  bool boolean(bool v) { return counted() && dom_.boolean(v); }
  bool number_integer(typename Json::number_integer_t v) { return counted() && dom_.number_integer(v); }
  bool number_unsigned(typename Json::number_unsigned_t v) { return counted() && dom_.number_unsigned(v); }
  bool number_float(typename Json::number_float_t v, const std::string& text) { return counted() && dom_.number_float(v, text); }
  bool string(std::string& v) { return counted() && dom_.string(v); }
  bool binary(typename Json::binary_t& v) { return counted() && dom_.binary(v); }
  bool start_object(size_t n) { return opened() && dom_.start_object(n); }
  bool key(std::string& k) { return dom_.key(k); }
  bool end_object() { return --depth_, dom_.end_object(); }
  bool start_array(size_t n) { return opened() && dom_.start_array(n); }
  bool end_array() { return --depth_, dom_.end_array(); }
  template <class Exception>
  bool parse_error(size_t position, const std::string& token, const Exception& e) { return dom_.parse_error(position, token, e); }

 private:
  bool counted() {
    if (++values_ > MAX_JSON_VALUES) throw bad("", "The request body holds more than " + std::to_string(MAX_JSON_VALUES) + " JSON values.");
    return true;
  }
  bool opened() {
    if (++depth_ > MAX_JSON_DEPTH) throw bad("", "The request body nests JSON deeper than " + std::to_string(MAX_JSON_DEPTH) + " levels.");
    return counted();
  }
  nlohmann::detail::json_sax_dom_parser<Json> dom_;
  size_t values_ = 0;
  int depth_ = 0;
};

template <class Json>
Json parse_bounded(std::string_view text) {
  Json parsed;
  try {
    BoundedTree<Json> tree(parsed);
    Json::sax_parse(text, &tree);
  } catch (const json::parse_error& e) {
    throw bad("", "The request body is not valid JSON (byte " + std::to_string(e.byte) + ").");
  } catch (const json::exception&) {  // a number out of range
    throw bad("", "The request body is not valid JSON (a number out of range).");
  }
  return parsed;
}

}  // namespace

json parse_body(std::string_view body) {
  if (body.find_first_not_of(" \t\r\n") == std::string_view::npos) throw bad("", "The request body is empty; expected a JSON object.");
  json parsed = parse_bounded<json>(body);
  if (!parsed.is_object()) throw bad("", "The request body must be a JSON object.");
  return parsed;
}

namespace {

// A request's fields, read one at a time; null counts as absent (OpenAI's optional fields take it).
class Fields {
 public:
  explicit Fields(const json& body) : body_(body) {}
  const json* get(const char* key) const {
    const auto it = body_.find(key);
    return it == body_.end() || it->is_null() ? nullptr : &*it;
  }
  bool boolean(const char* key, bool fallback) const {
    const json* v = get(key);
    if (!v) return fallback;
    if (!v->is_boolean()) throw bad(key, std::string("'") + key + "' must be a boolean.");
    return v->get<bool>();
  }
  int64_t integer(const char* key, int64_t fallback, int64_t lo, int64_t hi) const {
    const json* v = get(key);
    if (!v) return fallback;
    if (!v->is_number_integer()) throw bad(key, std::string("'") + key + "' must be an integer.");
    const bool above = v->is_number_unsigned() ? v->get<uint64_t>() > static_cast<uint64_t>(hi) : v->get<int64_t>() > hi;
    if (above || v->get<int64_t>() < lo)  // nlohmann reads a non-negative integer as unsigned
      throw bad(key, std::string("'") + key + "' must be between " + std::to_string(lo) + " and " + std::to_string(hi) + ".");
    return v->get<int64_t>();
  }
  double number(const char* key, double fallback, double lo, double hi) const {
    const json* v = get(key);
    if (!v) return fallback;
    if (!v->is_number()) throw bad(key, std::string("'") + key + "' must be a number.");
    const double x = v->get<double>();
    if (!(x >= lo && x <= hi))
      throw bad(key, std::string("'") + key + "' must be between " + format(lo) + " and " + format(hi) + ".");
    return x;
  }

 private:
  static std::string format(double x) {
    std::string s = std::to_string(x);
    s.erase(s.find_last_not_of('0') + 1);
    if (s.back() == '.') s.pop_back();
    return s;
  }
  const json& body_;
};

// Arguments OpenAI knows and this server does not implement: accepted only at their defaults.
bool is_default(const std::string& key, const json& v) {
  if (v.is_null()) return true;
  if (key == "best_of") return v.is_number_integer() && v.get<int64_t>() == 1;
  if (key == "metadata") return v.is_object();
  if (key == "functions") return v.is_array() && v.empty();
  if (key == "function_call") return v == "none" || v == "auto";
  if (key == "modalities") return v == json::array({"text"});
  if (key == "echo" || key == "store") return v == false;
  if (key == "suffix") return v == "";
  if (key == "user" || key == "service_tier") return v.is_string();
  return false;
}

// Each endpoint's arguments: those read, and those OpenAI knows that are taken only at their
// default (is_default).
struct Arguments {
  std::vector<std::string> read, default_only;
};

const Arguments& arguments_of(Endpoint endpoint) {
  static const Arguments chat = {
      {"model", "max_tokens", "temperature", "top_p", "seed", "stop", "stream", "stream_options", "logprobs", "ignore_eos",
       "messages", "max_completion_tokens", "top_logprobs", "n", "tools", "tool_choice", "parallel_tool_calls", "response_format",
       "grammar", "chat_template_kwargs"},
      {"user", "store", "metadata", "service_tier", "modalities", "functions", "function_call"}};
  static const Arguments completion = {
      {"model", "max_tokens", "temperature", "top_p", "seed", "stop", "stream", "stream_options", "logprobs", "ignore_eos",
       "prompt", "n", "response_format", "grammar"},
      {"echo", "suffix", "best_of", "user"}};
  return endpoint == Endpoint::chat ? chat : completion;
}

void check_arguments(const json& body, Endpoint endpoint) {
  const Arguments& known = arguments_of(endpoint);
  for (const auto& [key, value] : body.items()) {
    if (std::ranges::count(known.read, key) || std::ranges::count(engine::SAMPLING_KEYS, key)) continue;
    if (!std::ranges::count(known.default_only, key))
      throw bad(key.substr(0, 64), "Unrecognized request argument supplied: " + key.substr(0, 64));  // the name cut, in both
    if (!is_default(key, value)) throw bad(key, "'" + key + "' is not supported by this server except at its default.");
  }
}

std::string message_text(const json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) throw bad(where, "'" + where + "' must be a string or a list of text parts.");
  std::string text;
  for (const json& part : content) {
    if (!part.is_object() || part.value("type", json()) != "text" || !part.contains("text") || !part["text"].is_string())
      throw bad(where, "'" + where + "' may hold only {\"type\": \"text\", \"text\": ...} parts.");
    text += part["text"].get<std::string>();
  }
  return text;
}

// An assistant message's tool_calls, as the templates read them: each function's arguments an
// object (OpenAI sends a JSON string; vLLM and transformers' templates take the object), a string
// that is not a JSON object kept as it is.
json assistant_tool_calls(const json& calls, const std::string& where) {
  if (!calls.is_array()) throw bad(where, "'" + where + "' must be a list.");
  json out = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    const std::string at = where + "[" + std::to_string(i) + "]";
    const json& c = calls[i];
    const json* function = c.is_object() && c.contains("function") ? &c["function"] : nullptr;
    if (!function || !function->is_object() || !function->contains("name") || !(*function)["name"].is_string())
      throw bad(at, "'" + at + "' must be {\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\"}}.");
    const json id = c.value("id", json(""));
    json call = {{"id", id.is_string() ? id : json("")}, {"type", "function"}, {"function", {{"name", (*function)["name"]}}}};
    const json arguments = function->value("arguments", json("{}"));
    if (!arguments.is_string() && !arguments.is_object()) throw bad(at + ".function.arguments", "'" + at + ".function.arguments' must be a string.");
    call["function"]["arguments"] = arguments;
    if (arguments.is_string()) try {  // bounded as the body is: the text is the client's
        json parsed = parse_bounded<json>(arguments.get_ref<const std::string&>());
        if (parsed.is_object()) call["function"]["arguments"] = std::move(parsed);
      } catch (const ApiError&) {
      }
    out.push_back(std::move(call));
  }
  return out;
}

// The messages as the chat template reads them: role (developer is system), content as one
// string, and the tool-calling fields.
nlohmann::ordered_json chat_messages(const Fields& f) {
  const json* list = f.get("messages");
  if (!list) throw bad("messages", "'messages' is required.");
  if (!list->is_array() || list->empty()) throw bad("messages", "'messages' must be a non-empty list.");
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  static const std::vector<std::string> keys = {"role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content", "refusal"};
  for (size_t i = 0; i < list->size(); ++i) {
    const json& m = (*list)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) throw bad(where, "'" + where + "' must be an object.");
    for (const auto& [key, value] : m.items())
      if (!std::ranges::count(keys, key))
        throw bad(where + "." + key.substr(0, 64), "'" + where + "." + key.substr(0, 64) + "' is not supported by this server.");
    const json role = m.value("role", json());
    static const std::vector<std::string> roles = {"system", "developer", "user", "assistant", "tool"};
    if (!role.is_string() || !std::ranges::count(roles, role.get<std::string>()))
      throw bad(where + ".role", "'" + where + ".role' must be one of system, developer, user, assistant, tool.");
    const std::string r = role.get<std::string>();
    const bool calls = m.contains("tool_calls") && !m["tool_calls"].is_null();
    if (calls && r != "assistant") throw bad(where + ".tool_calls", "'" + where + ".tool_calls' is allowed only in an assistant message.");
    if (!m.contains("content") && !calls) throw bad(where + ".content", "'" + where + ".content' is required.");
    nlohmann::ordered_json out = {{"role", r == "developer" ? "system" : r},
                                  {"content", m.contains("content") && !m["content"].is_null() ? message_text(m["content"], where + ".content") : ""}};
    for (const char* key : {"name", "tool_call_id", "reasoning_content"}) {
      if (!m.contains(key) || m[key].is_null()) continue;
      if (!m[key].is_string()) throw bad(where + "." + key, "'" + where + "." + key + "' must be a string.");
      out[key] = m[key];
    }
    if (calls) out["tool_calls"] = assistant_tool_calls(m["tool_calls"], where + ".tool_calls");
    messages.push_back(std::move(out));
  }
  return messages;
}

// OpenAI's tool list: functions with a name of letters, digits, _ and - (64 at most), an optional
// description and a parameters schema.
nlohmann::ordered_json read_tools(const Fields& f) {
  const json* tools = f.get("tools");
  if (!tools) return nullptr;
  if (!tools->is_array() || tools->size() > MAX_TOOLS)
    throw bad("tools", "'tools' must be a list of at most " + std::to_string(MAX_TOOLS) + " tools.");
  std::vector<std::string> names;
  for (size_t i = 0; i < tools->size(); ++i) {
    const std::string where = "tools[" + std::to_string(i) + "]";
    const json& t = (*tools)[i];
    if (!t.is_object() || t.value("type", json()) != "function" || !t.contains("function") || !t["function"].is_object())
      throw bad(where, "'" + where + "' must be {\"type\": \"function\", \"function\": {...}}.");
    const json& fn = t["function"];
    const json name = fn.value("name", json());
    const auto name_char = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; };
    if (!name.is_string() || name.get_ref<const std::string&>().empty() || name.get_ref<const std::string&>().size() > 64 ||
        !std::ranges::all_of(name.get_ref<const std::string&>(), name_char))
      throw bad(where + ".function.name", "'" + where + ".function.name' must be 1 to 64 letters, digits, '_' or '-'.");
    if (std::ranges::count(names, name.get<std::string>())) throw bad(where + ".function.name", "'" + where + ".function.name' names a function twice.");
    names.push_back(name.get<std::string>());
    if (fn.contains("parameters") && !fn["parameters"].is_null() && !fn["parameters"].is_object())
      throw bad(where + ".function.parameters", "'" + where + ".function.parameters' must be a JSON schema object.");
    if (fn.contains("description") && !fn["description"].is_null() && !fn["description"].is_string())
      throw bad(where + ".function.description", "'" + where + ".function.description' must be a string.");
  }
  return *tools;
}

ToolChoice read_tool_choice(const Fields& f, const nlohmann::ordered_json& tools) {
  const json* c = f.get("tool_choice");
  const bool have_tools = tools.is_array() && !tools.empty();
  if (!c) return {have_tools ? ToolChoice::Mode::automatic : ToolChoice::Mode::none, ""};
  ToolChoice choice;
  if (*c == "none") choice.mode = ToolChoice::Mode::none;
  else if (*c == "auto") choice.mode = have_tools ? ToolChoice::Mode::automatic : ToolChoice::Mode::none;
  else if (*c == "required") choice.mode = ToolChoice::Mode::required;
  else if (c->is_object() && c->value("type", json()) == "function" && c->contains("function") && (*c)["function"].is_object() &&
           (*c)["function"].value("name", json()).is_string()) {
    choice.mode = ToolChoice::Mode::function;
    choice.function = (*c)["function"]["name"].get<std::string>();
  } else {
    throw bad("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}.");
  }
  if (choice.mode == ToolChoice::Mode::required && !have_tools) throw bad("tool_choice", "'tool_choice' is \"required\" but 'tools' is empty.");
  if (choice.mode == ToolChoice::Mode::function &&
      (!have_tools || std::ranges::none_of(tools, [&](const auto& t) { return t["function"]["name"] == choice.function; })))
    throw bad("tool_choice", "'tool_choice' names a function that is not in 'tools'.");
  return choice;
}

// chat_template_kwargs (vLLM's extension): more keyword arguments for the template (enable_thinking, ...).
nlohmann::ordered_json template_kwargs(const Fields& f) {
  const json* k = f.get("chat_template_kwargs");
  if (!k) return nlohmann::ordered_json::object();
  if (!k->is_object()) throw bad("chat_template_kwargs", "'chat_template_kwargs' must be an object.");
  return *k;
}

// response_format (OpenAI's text, json_object, json_schema) or `grammar` (GBNF, llama.cpp's field).
OutputFormat read_output_format(const Fields& f) {
  OutputFormat out;
  const json* grammar = f.get("grammar");
  const json* format = f.get("response_format");
  if (grammar && format) throw bad("grammar", "'grammar' and 'response_format' cannot both be given.");
  if (grammar) {
    if (!grammar->is_string() || grammar->get_ref<const std::string&>().empty()) throw bad("grammar", "'grammar' must be a GBNF grammar (a string).");
    out.kind = OutputFormat::Kind::grammar;
    out.grammar = grammar->get<std::string>();
    return out;
  }
  if (!format) return out;
  const json type = format->is_object() ? format->value("type", json()) : json();
  if (type == "text") return out;
  if (type == "json_object") {
    out.kind = OutputFormat::Kind::json_object;
    return out;
  }
  if (type != "json_schema") throw bad("response_format", "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\".");
  const json spec = format->value("json_schema", json());
  if (!spec.is_object() || !spec.value("name", json("")).is_string())
    throw bad("response_format.json_schema", "'response_format.json_schema' must be {\"name\", \"schema\", \"strict\"?}.");
  const json schema = spec.value("schema", json::object());
  if (!schema.is_object() && !schema.is_boolean()) throw bad("response_format.json_schema.schema", "'response_format.json_schema.schema' must be a JSON schema object.");
  out.kind = OutputFormat::Kind::json_schema;
  out.schema = schema;
  return out;
}

std::vector<int> completion_prompt(const Fields& f, const PromptModel& model) {
  const json* p = f.get("prompt");
  if (!p) throw bad("prompt", "'prompt' is required.");
  if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) p = &(*p)[0];  // a batch of one
  if (p->is_string()) return model.encode(p->get_ref<const std::string&>());
  if (!p->is_array() || p->empty() || !std::ranges::all_of(*p, [](const json& t) { return t.is_number_integer(); }))
    throw bad("prompt", "'prompt' must be a string or a non-empty list of token ids (one prompt per request).");
  if (p->size() >= static_cast<size_t>(model.context))  // refused before a vector of ids is built
    throw bad("prompt", "This model's maximum context length is " + std::to_string(model.context) + " tokens. However, your prompt resulted in " +
                            std::to_string(p->size()) + " tokens.", "context_length_exceeded");
  std::vector<int> ids;
  for (const json& t : *p) {
    if (t.is_number_unsigned() ? t.get<uint64_t>() >= static_cast<uint64_t>(model.vocab) : t.get<int64_t>() < 0 || t.get<int64_t>() >= model.vocab)
      throw bad("prompt", "'prompt' holds a token id outside the vocabulary (0 to " + std::to_string(model.vocab - 1) + ").");
    ids.push_back(t.get<int>());
  }
  return ids;
}

std::vector<std::string> stop_strings(const Fields& f) {
  const json* s = f.get("stop");
  if (!s) return {};
  std::vector<std::string> out;
  if (s->is_string()) out.push_back(s->get<std::string>());
  else if (s->is_array() && s->size() <= 4 && std::ranges::all_of(*s, [](const json& x) { return x.is_string(); }))
    for (const json& x : *s) out.push_back(x.get<std::string>());
  else throw bad("stop", "'stop' must be a string or a list of up to 4 strings.");
  if (std::ranges::any_of(out, [](const std::string& x) { return x.empty(); })) throw bad("stop", "'stop' holds an empty string.");
  return out;
}

void read_logprobs(const Fields& f, Endpoint endpoint, GenerationRequest& r) {
  if (endpoint == Endpoint::completion) {  // the legacy form: an integer, the alternatives per token
    r.top_logprobs = static_cast<int>(f.integer("logprobs", -1, 0, 5));
    r.logprobs = r.top_logprobs >= 0;
    r.top_logprobs = std::max(r.top_logprobs, 0);
    return;
  }
  r.logprobs = f.boolean("logprobs", false);
  r.top_logprobs = static_cast<int>(f.integer("top_logprobs", 0, 0, 20));
  if (r.top_logprobs > 0 && !r.logprobs) throw bad("top_logprobs", "'top_logprobs' needs 'logprobs' to be true.");
}

void read_stream(const Fields& f, GenerationRequest& r) {
  r.stream = f.boolean("stream", false);
  const json* options = f.get("stream_options");
  if (!options) return;
  if (!r.stream) throw bad("stream_options", "'stream_options' is allowed only when 'stream' is true.");
  if (!options->is_object()) throw bad("stream_options", "'stream_options' must be an object.");
  for (const auto& [key, value] : options->items())
    if (key != "include_usage" && key != "include_obfuscation")
      throw bad("stream_options." + key.substr(0, 64), "Unrecognized stream option: " + key.substr(0, 64));
  r.include_usage = Fields(*options).boolean("include_usage", false);
}

// max_tokens (max_completion_tokens on chat): within what the context leaves after the prompt.
void read_max_tokens(const Fields& f, Endpoint endpoint, const PromptModel& model, GenerationRequest& r) {
  const int prompt = static_cast<int>(r.prompt.size());
  if (prompt >= model.context)
    throw bad("messages", "This model's maximum context length is " + std::to_string(model.context) + " tokens. However, your " +
                              (endpoint == Endpoint::chat ? "messages" : "prompt") + " resulted in " + std::to_string(prompt) +
                              " tokens.",
              "context_length_exceeded");
  const int room = model.context - prompt;
  const char* key = endpoint == Endpoint::chat && f.get("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  const int64_t asked = f.integer(key, endpoint == Endpoint::chat ? room : std::min(16, room), 1, std::numeric_limits<int32_t>::max());
  if (asked > room)
    throw bad(key, "'" + std::string(key) + "' is " + std::to_string(asked) + ", but the prompt's " + std::to_string(prompt) +
                       " tokens leave " + std::to_string(room) + " of the model's context of " + std::to_string(model.context) + ".",
              "context_length_exceeded");
  r.max_tokens = static_cast<int>(asked);
}

}  // namespace

GenerationRequest parse_generation_request(const json& body, Endpoint endpoint, const PromptModel& model) {
  check_arguments(body, endpoint);
  const Fields f(body);
  if (const json* m = f.get("model"); m && (!m->is_string() || *m != model.name))
    throw ApiError(400, m->is_string() ? "The model '" + m->get<std::string>().substr(0, 128) + "' does not exist; this server has '" + model.name + "'."
                                       : std::string("'model' must be a string."),
                   "model", "model_not_found");
  GenerationRequest r;
  r.endpoint = endpoint;
  r.temperature = static_cast<float>(f.number("temperature", 1.0, 0.0, 2.0));
  r.top_p = static_cast<float>(f.number("top_p", 1.0, 0.0, 1.0));
  if (f.get("seed")) r.seed = static_cast<uint64_t>(f.integer("seed", 0, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()));
  try {
    nlohmann::json sampling = nlohmann::json::object();  // the sampling keys alone, not a copy of the whole body
    for (const char* key : engine::SAMPLING_KEYS)
      if (const auto it = body.find(key); it != body.end()) sampling[key] = *it;
    r.sampling = engine::read_sampling_params(sampling, model.vocab);
  } catch (const engine::SamplingParamError& e) {
    throw bad(e.field(), e.what());
  }
  r.stop = stop_strings(f);
  r.ignore_eos = f.boolean("ignore_eos", false);
  read_stream(f, r);
  read_logprobs(f, endpoint, r);
  r.n = static_cast<int>(f.integer("n", 1, 1, MAX_CHOICES));
  r.format = read_output_format(f);
  if (endpoint == Endpoint::chat) {
    r.tools = read_tools(f);
    r.tool_choice = read_tool_choice(f, r.tools);
    r.parallel_tool_calls = f.boolean("parallel_tool_calls", true);
    if (r.tool_choice.mode != ToolChoice::Mode::none && r.tool_choice.mode != ToolChoice::Mode::automatic &&
        r.format.kind != OutputFormat::Kind::text)
      throw bad("response_format", "'response_format' cannot constrain an answer that 'tool_choice' requires to be a tool call.");
  }
  r.prompt = endpoint == Endpoint::chat ? model.chat(chat_messages(f), r.tools, template_kwargs(f)) : completion_prompt(f, model);
  if (r.prompt.empty()) throw bad(endpoint == Endpoint::chat ? "messages" : "prompt", "The prompt holds no tokens.");
  read_max_tokens(f, endpoint, model, r);
  return r;
}

}  // namespace tpcli::serve
