// tpcli chat --model M [--tokenizer PATH] [--devices N | --mesh model=N] [--system TEXT]
//            [--template NAME] [-n REPLY_TOKENS] [-t TEMPERATURE] [-p TOPP] [-s SEED] [--context N]
//            [--verbose]
// M: a llama2.c .bin, a tpcli .safetensors or a Hugging Face model directory (whose tokenizer.json
// and tokenizer_config.json are the default tokenizer and chat template). A reply ends at the
// template's end-of-turn token, the tokenizer's eos, or an eos id of the model's config.
// An interactive conversation: each line of stdin is a user turn (a pipe works too); the reply
// streams to stdout as it is generated, then a newline. The KV cache is kept across turns: only the
// tokens past what is already cached are fed (engine/chat_session.h). --verbose writes one JSON
// line per turn on stderr: {"turn", "start", "fed", "generated", "end"}.
// A conversation that outgrows the context ends there with one line on stderr and exit code 1 (a
// reply was cut, or a turn went unanswered); a stdin line too long for the context is exit 2.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "cli/model_file.h"
#include "cli/prompt_text.h"
#include "cli/tokenizer_setup.h"
#include "engine/chat_session.h"
#include "engine/generate.h"
#include "files/regular_file.h"

namespace tpcli::cli {

namespace {

struct ChatFlags {
  std::string model;
  std::string adapter;  // --adapter: a PEFT LoRA folder or GGUF LoRA file, applied unmerged
  std::string tokenizer;  // "" = the model directory, else the checkpoint's recorded tokenizer
  std::string system;
  ChatTemplateFlags chat_template;
  int reply_tokens = 256;
  float temperature = 1.0f;
  float topp = 0.9f;
  long long seed = 0;  // 0 = from the clock
  engine::SamplingParams sampling;  // --top-k, --min-p, the penalties
  bool verbose = false;
  int context = 0;  // KV cache positions; 0 = the model's (capped for Hugging Face directories)
  std::string kv_dtype = "f32";  // --kv-dtype
  std::string tools;  // --tools: a JSON file of OpenAI tools
};

// --tools FILE.json: OpenAI's tool list ([{"type": "function", "function": {"name", ...}}]), in its key order.
nlohmann::ordered_json read_tools(const std::string& path) {
  if (path.empty()) return nullptr;
  nlohmann::ordered_json tools;
  try {
    tools = nlohmann::ordered_json::parse(files::read_text_file(path, "a tools file (--tools)"));
  } catch (const nlohmann::json::exception& e) {
    throw UsageError("--tools " + path + ": not JSON (" + std::string(e.what()) + ")");
  } catch (const std::runtime_error& e) {
    throw UsageError(e.what());
  }
  if (!tools.is_array() || tools.empty()) throw UsageError("--tools " + path + ": expected a non-empty JSON list of tools");
  for (size_t i = 0; i < tools.size(); ++i) {
    const auto& t = tools[i];
    if (!t.is_object() || t.value("type", "") != "function" || !t.contains("function") || !t["function"].is_object() ||
        !t["function"].contains("name") || !t["function"]["name"].is_string())
      throw UsageError("--tools " + path + ": tool " + std::to_string(i) + " is not {\"type\": \"function\", \"function\": {\"name\", ...}}");
  }
  return tools;
}

// The calls a reply made, a line each: "[tool call] NAME ARGUMENTS"; the next lines are their results.
void print_tool_calls(const engine::TurnReport& r, std::FILE* out) {
  for (const text::ToolCall& call : r.tool_calls) std::fprintf(out, "[tool call] %s %s\n", call.name.c_str(), call.arguments.c_str());
  if (!r.tool_calls.empty() && isatty(STDIN_FILENO))
    std::fprintf(stderr, "(type each call's result, a line each)\n");
}

// The user's lines, read once from stdin and handed to every device thread in the same order. A
// line longer than `max_bytes` ends the input (it cannot fit the context; stdin may be /dev/zero,
// which has no newline): it is not read on, and too_long_line() names it.
class SharedLines {
 public:
  explicit SharedLines(int64_t max_bytes) : max_bytes_(static_cast<size_t>(max_bytes)) {}

  std::optional<std::string> line(size_t index) {
    std::lock_guard<std::mutex> lock(mutex_);
    while (lines_.size() <= index && !eof_) read_one();
    if (index < lines_.size()) return lines_[index];
    return std::nullopt;
  }
  // 1-based number of the line of stdin that was too long; 0 when none was.
  size_t too_long_line() const { return too_long_line_; }

 private:
  void read_one() {
    if (isatty(STDIN_FILENO)) std::fputs("> ", stderr);
    std::string text;
    int c;
    while ((c = std::fgetc(stdin)) != EOF && c != '\n') {
      if (text.size() == max_bytes_) {
        too_long_line_ = stdin_lines_ + 1;
        eof_ = true;
        return;
      }
      text += static_cast<char>(c);
    }
    ++stdin_lines_;
    if (c == EOF && text.empty()) {
      eof_ = true;
      return;
    }
    if (!text.empty() && text.back() == '\r') text.pop_back();
    if (!text.empty()) lines_.push_back(std::move(text));  // a blank line is no turn
  }
  const size_t max_bytes_;
  std::mutex mutex_;
  std::vector<std::string> lines_;
  size_t stdin_lines_ = 0;    // lines of stdin read, blank ones included
  size_t too_long_line_ = 0;
  bool eof_ = false;
};

std::string tokenizer_path(const ChatFlags& f, const OpenedModel& opened) {
  if (auto path = model_tokenizer_path(f.tokenizer, opened)) return *path;
  throw UsageError(f.model + ": no tokenizer recorded with the model; pass --tokenizer PATH");
}

void print_turn(size_t turn, const engine::TurnReport& r) {
  const nlohmann::json line = {{"turn", turn},         {"start", r.start_pos},
                               {"fed", r.fed},         {"generated", r.generated},
                               {"end", std::string(engine::turn_end_name(r.end))}};
  std::fprintf(stderr, "%s\n", line.dump().c_str());
}

// One device's whole conversation; device 0 (out != null) streams and reports, and sets
// `cut_short` to why the conversation ended before stdin did (the context is full).
engine::GenerateResult converse(const ChatFlags& f, const text::TokenizerInterface& tokenizer,
                               const ChatFormatting& formatting, const engine::ChatOptions& options,
                               const model::LlamaConfig& config, SharedLines& lines, const engine::ModelFns& model,
                               std::FILE* out, std::string& cut_short) {
  engine::ChatSession session(tokenizer, formatting.chat_template, formatting.tokens, options, config.vocab_size,
                             config.seq_len);
  engine::GenerateResult result;
  for (size_t turn = 0;; ++turn) {
    const std::optional<std::string> line = lines.line(turn);
    if (!line) break;
    engine::TurnReport report;
    try {
      report = session.turn(*line, model, out);
    } catch (const std::runtime_error& e) {  // the context is full: the conversation ends here
      if (out) cut_short = e.what();
      break;
    }
    if (report.awaits_tool_results) continue;
    if (out) print_tool_calls(report, out);
    result.text += report.reply + "\n";
    result.tokens.insert(result.tokens.end(), report.fed.begin(), report.fed.end());
    result.tokens.insert(result.tokens.end(), report.generated.begin(), report.generated.end());
    if (out && f.verbose) print_turn(turn + 1, report);
    if (report.end == engine::TurnEnd::ContextFull) {
      if (out) cut_short = "the model's context of " + std::to_string(config.seq_len) + " positions is full: reply " +
                           std::to_string(turn + 1) + " was cut short";
      break;
    }
  }
  result.positions = static_cast<int>(session.cached().size());
  return result;
}

void run_chat(const ChatFlags& f, const RunFlags& run_flags) {
  const nn::KvDtype kv_dtype = parse_kv_dtype(f.kv_dtype);
  const InferenceAxes where = inference_mesh_from_flags(run_flags);
  OpenedModel opened = open_model(f.model);
  apply_load_flags(opened, "auto", f.context);
  apply_adapter(opened, f.adapter);
  const model::Placement placement = place_model(opened, f.model, where.mesh, where.roles);
  const model::LlamaConfig& config = opened.weights->config();
  const std::string path = tokenizer_path(f, opened);
  const text::LoadedTokenizer loaded = open_model_tokenizer(path, config.vocab_size);
  const ChatFormatting formatting = chat_formatting(loaded, f.chat_template);
  if (f.reply_tokens < 1) throw UsageError("-n/--reply-tokens = " + std::to_string(f.reply_tokens) + " must be >= 1");

  engine::GenerateOptions sampling{.temperature = f.temperature, .topp = f.topp, .seed = static_cast<uint64_t>(f.seed)};
  sampling = engine::normalized(sampling, config.seq_len);  // llama2.c's rules for seed, temperature, top-p
  check_sampling_flags(f.sampling, config.vocab_size);
  const engine::ChatOptions options{f.system,      f.reply_tokens, sampling.temperature,
                                   sampling.topp, sampling.seed,  opened.eos_token_ids, f.sampling, read_tools(f.tools)};
  try {  // a template whose end-of-turn token the tokenizer lacks: before any device starts
    engine::ChatSession(*loaded.tokenizer, formatting.chat_template, formatting.tokens, options, config.vocab_size,
                       config.seq_len);
  } catch (const std::invalid_argument& e) {
    throw UsageError(loaded.path + ": " + e.what());
  }
  SharedLines lines(max_text_bytes(config.seq_len));
  std::string cut_short;  // written by device 0 only
  engine::run_model_on_mesh(
      *opened.weights, placement,
      [&](const engine::ModelFns& model, std::FILE* out) {
        return converse(f, *loaded.tokenizer, formatting, options, config, lines, model, out, cut_short);
      },
      stdout, {}, kv_dtype);
  std::fflush(stdout);
  if (lines.too_long_line() > 0)
    throw UsageError("stdin: line " + std::to_string(lines.too_long_line()) + " is longer than " +
                     std::to_string(max_text_bytes(config.seq_len)) + " bytes, more text than the model's context of " +
                     std::to_string(config.seq_len) + " positions can hold");
  // A script piping its turns in must learn that not all of them were answered in full.
  if (!cut_short.empty()) {
    std::fprintf(stderr, "tpcli chat: %s; the conversation ends here (--context, when below the model's, holds more)\n",
                 cut_short.c_str());
    throw CLI::RuntimeError(1);
  }
}

void setup_chat(CLI::App& sub) {
  auto flags = std::make_shared<ChatFlags>();
  auto run_flags = add_run_flags(sub, FLAG_DEVICES | FLAG_MESH | FLAG_ROLES);
  sub.add_option("--model", flags->model, "checkpoint: llama2.c .bin, tpcli .safetensors (or a model directory)")
      ->required();
  add_adapter_flag(sub, flags->adapter);
  sub.add_option("-z,--tokenizer", flags->tokenizer,
                 "tokenizer.json, a directory holding it and tokenizer_config.json, or a llama2.c tokenizer.bin");
  sub.add_option("--system", flags->system, "a system message before the conversation");
  add_chat_template_flags(sub, flags->chat_template);
  sub.add_option("--context", flags->context,
                 "positions to hold in the KV cache, at most the model's (0: the model's; Hugging Face "
                 "directories: at most 8192)");
  add_kv_dtype_flag(sub, flags->kv_dtype);
  sub.add_option("-n,--reply-tokens", flags->reply_tokens, "tokens per reply at most")->capture_default_str();
  sub.add_option("-t,--temperature", flags->temperature, "0 = greedy")->capture_default_str();
  sub.add_option("-p,--topp", flags->topp, "top-p (nucleus) sampling; 0 or 1 = off")->capture_default_str();
  add_sampling_flags(sub, flags->sampling);
  sub.add_option("-s,--seed", flags->seed, "random seed (default: the clock)");
  sub.add_option("--tools", flags->tools,
                 "a JSON file of OpenAI tools the model may call: its calls print as \"[tool call] NAME ARGUMENTS\" lines, and the "
                 "next input lines are their results");
  sub.add_flag("--verbose", flags->verbose, "one JSON line per turn on stderr: start position, tokens fed and generated");
  sub.callback([flags, run_flags] { run_chat(*flags, *run_flags); });
}

const bool registered = register_command({"chat", "Talk with a model through its chat template", setup_chat});

}  // namespace

}  // namespace tpcli::cli
