// tpcli eval --model M --data FILE.jsonl [-z TOKENIZER] [--devices N | --mesh model=N]
//            [--max-tokens 64] [--template NAME] [--format auto|chat|completions] [--verbose]
// M: a llama2.c .bin, a tpcli .safetensors or a Hugging Face model directory; the tokenizer is -z,
// else the model directory's, else the one a checkpoint records.
// Exact-match evaluation on supervised fine-tuning examples (train/sft_examples.h, the same parsing
// and tokens as `tpcli train`'s): for each example, the prompt (chat: every message but the last,
// which must be the assistant's, rendered with the generation prompt; completions: BOS and the
// prompt) is fed and the model generates greedily until an end-of-generation token
// (engine/end_of_generation.h: an eos id of the model's config, the tokenizer's eos, a chat
// template's end-of-turn token, a llama2.c tokenizer's BOS as run.c), the text of one of those
// markers (when the tokenizer spells it with several tokens), --max-tokens tokens or the end of the
// context. The generated text, cut at the end marker and whitespace-trimmed, is compared with
// the reference (the last assistant message or the completion, trimmed). The last line of stdout
// is "exact match: K/N"; --verbose first prints one JSON line per example
// {"example", "match", "generated", "reference"}.
// --adapter DIR: a PEFT LoRA folder (a [train.lora] run's out_dir/adapter), applied unmerged.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "cli/model_file.h"
#include "cli/tokenizer_setup.h"
#include "engine/end_of_generation.h"
#include "engine/generate.h"
#include "files/json_file.h"
#include "files/line_reader.h"
#include "text/text_stream.h"
#include "train/sft_examples.h"

namespace tpcli::cli {

namespace {

struct EvalFlags {
  std::string model;
  std::string tokenizer;  // "" = the model directory's, else the checkpoint's recorded tokenizer
  std::string data;
  ChatTemplateFlags chat_template;
  std::string format = "auto";
  int max_tokens = 64;
  bool verbose = false;
  std::string adapter;  // --adapter: a PEFT LoRA folder or GGUF LoRA file, applied unmerged
};

std::string tokenizer_path(const EvalFlags& f, const OpenedModel& opened) {
  if (auto path = model_tokenizer_path(f.tokenizer, opened)) return *path;
  throw UsageError(f.model + ": no tokenizer recorded with the model; pass -z/--tokenizer PATH");
}

// --format auto: the first example's keys decide ("messages": chat, "prompt": completions).
train::SftFormat eval_format(const EvalFlags& f) {
  if (f.format == "chat") return train::SftFormat::Chat;
  if (f.format == "completions") return train::SftFormat::Completions;
  if (f.format != "auto") throw UsageError("--format " + f.format + ": expected auto, chat or completions");
  std::string line;
  std::string where = f.data;
  try {
    files::LineReader lines(f.data, "a JSONL file");  // /dev/zero: refused, not read for ever
    while (lines.next(line) && line.find_first_not_of(" \t\r") == std::string::npos) {
    }
    where = lines.where();
  } catch (const std::runtime_error& e) {
    throw UsageError(e.what());
  }
  if (line.find_first_not_of(" \t\r") == std::string::npos) throw UsageError(f.data + ": no example (an empty file)");
  nlohmann::json first;
  try {
    first = files::parse_json_text(line, where);
  } catch (const std::exception& e) {
    throw UsageError(e.what());
  }
  if (first.is_object() && first.contains("messages")) return train::SftFormat::Chat;
  if (first.is_object() && first.contains("prompt")) return train::SftFormat::Completions;
  throw UsageError(where + ": neither {\"messages\": ...} (chat) nor {\"prompt\": ..., \"completion\": ...} (completions)");
}

// What ends a generated answer: the end-of-generation ids, and their texts also when the tokenizer
// spells one with several tokens.
using Stops = engine::EndOfGeneration;

// Greedy generation from `prompt` on this device's model (every device runs the same calls):
// the answer's text (decoded alone, as it goes), cut at the first end marker and trimmed.
std::string generate_answer(const engine::ModelFns& model, const text::TokenizerInterface& tokenizer, const Stops& stops,
                            std::span<const int> prompt, int max_tokens, const model::LlamaConfig& config) {
  engine::GenerateOptions options;
  options.temperature = 0.0f;
  options.steps = static_cast<int>(std::min<int64_t>(static_cast<int64_t>(prompt.size()) + max_tokens, config.seq_len));
  text::TextStream answer(tokenizer, {}, stops.texts);  // the tokens picked after the prompt, the stop token excluded
  size_t calls = 0;  // on_next sees the forced prompt tokens first (prompt.size() - 1 of them)
  engine::generate_from_ids(model, prompt, config.vocab_size, options, [&](int, int next) {
    if (++calls < prompt.size()) return true;
    if (std::find(stops.ids.begin(), stops.ids.end(), next) != stops.ids.end()) return false;
    answer.add(next);
    return !answer.stopped();
  });
  answer.flush();
  return train::trim_whitespace(answer.text());
}

void run_eval(const EvalFlags& f, const RunFlags& run_flags) {
  if (f.max_tokens < 1) throw UsageError("--max-tokens = " + std::to_string(f.max_tokens) + " must be >= 1");
  const InferenceAxes where = inference_mesh_from_flags(run_flags);
  OpenedModel opened = open_model(f.model);
  apply_load_flags(opened, "auto", 0);
  apply_adapter(opened, f.adapter);
  const model::Placement placement = place_model(opened, f.model, where.mesh, where.roles);
  const model::LlamaConfig& config = opened.weights->config();
  const std::string path = tokenizer_path(f, opened);
  const text::LoadedTokenizer loaded = open_model_tokenizer(path, config.vocab_size);

  train::SftEncoding encoding;
  encoding.format = eval_format(f);
  encoding.tokenizer = loaded.tokenizer.get();
  encoding.chat_tokens = {loaded.tokenizer->bos_text(), loaded.tokenizer->eos_text()};
  if (encoding.format == train::SftFormat::Chat) encoding.chat_template = chat_formatting(loaded, f.chat_template).chat_template;
  std::vector<train::EvalCase> cases;
  try {
    for (const train::SftExample& example : train::read_sft_examples(f.data, encoding.format))
      cases.push_back(train::eval_case(example, encoding));
  } catch (const train::SftDataError& e) {
    throw UsageError(e.what());
  }
  for (const train::EvalCase& c : cases)
    if (static_cast<int>(c.prompt.size()) >= config.seq_len)
      throw UsageError(c.where + ": the prompt is " + std::to_string(c.prompt.size()) +
                       " tokens, no room left to answer in the model's context of " + std::to_string(config.seq_len) +
                       " positions");
  const Stops stops =
      engine::end_of_generation(*loaded.tokenizer, opened.eos_token_ids,
                               encoding.format == train::SftFormat::Chat ? &encoding.chat_template : nullptr, encoding.chat_tokens);

  std::vector<std::string> answers;  // device 0's
  engine::run_model_on_mesh(
      *opened.weights, placement,
      [&](const engine::ModelFns& model, std::FILE* out) {
        engine::GenerateResult all;  // every device's answers, compared by run_model_on_mesh
        for (const train::EvalCase& c : cases) {
          std::string answer = generate_answer(model, *loaded.tokenizer, stops, c.prompt, f.max_tokens, config);
          all.text += answer + "\n";
          if (out) answers.push_back(std::move(answer));
        }
        return all;
      },
      stdout);  // nothing is written during generation: `out` only tells device 0 apart
  size_t matches = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const bool match = answers[i] == cases[i].reference;
    matches += match ? 1 : 0;
    if (f.verbose) {
      const nlohmann::ordered_json line = {{"example", i + 1}, {"match", match}, {"generated", answers[i]}, {"reference", cases[i].reference}};
      std::printf("%s\n", line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    }
  }
  std::printf("exact match: %zu/%zu\n", matches, cases.size());
  std::fflush(stdout);
}

void setup_eval(CLI::App& sub) {
  auto flags = std::make_shared<EvalFlags>();
  auto run_flags = add_run_flags(sub, FLAG_DEVICES | FLAG_MESH | FLAG_ROLES);
  sub.add_option("--model", flags->model, "checkpoint: llama2.c .bin, tpcli .safetensors (or a model directory)")
      ->required();
  add_adapter_flag(sub, flags->adapter);
  sub.add_option("--data", flags->data, "JSONL examples: {\"messages\": [...]} (chat) or {\"prompt\", \"completion\"}")
      ->required();
  sub.add_option("-z,--tokenizer", flags->tokenizer,
                 "tokenizer.json, a directory holding it and tokenizer_config.json, or a llama2.c tokenizer.bin");
  add_chat_template_flags(sub, flags->chat_template);
  sub.add_option("--format", flags->format, "auto (from the first example's keys), chat or completions")
      ->capture_default_str();
  sub.add_option("--max-tokens", flags->max_tokens, "tokens generated per answer at most")->capture_default_str();
  sub.add_flag("--verbose", flags->verbose, "one JSON line per example before the total");
  sub.callback([flags, run_flags] { run_eval(*flags, *run_flags); });
}

const bool registered = register_command({"eval", "Exact-match evaluation on chat or completions examples", setup_eval});

}  // namespace

}  // namespace tpcli::cli
