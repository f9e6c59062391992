// tpcli::cli — infer --batch (see infer_batch.h).
#include "cli/infer_batch.h"

#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <optional>
#include <span>

#include "cli/commands.h"
#include "cli/tokenizer_setup.h"
#include "model/batch_generate.h"
#include "model/chat_template.h"
#include "model/llama.h"

namespace tpcli::cli {

namespace {

using nlohmann::json;

// A line's text to generate from: its prompt, or its messages through the chat template.
std::string prompt_text(const json& line, const std::string& where, const model::LoadedTokenizer& loaded) {
  if (line.contains("prompt")) {
    if (!line["prompt"].is_string()) throw UsageError(where + ": \"prompt\" is not a string");
    return line["prompt"].get<std::string>();
  }
  if (!line.contains("messages")) throw UsageError(where + ": needs \"prompt\" or \"messages\"");
  const std::vector<model::ChatMessage> messages = parse_messages(line["messages"].dump(), where + ": \"messages\"");
  const ChatFormatting chat = chat_formatting(loaded, "");
  try {
    return model::render_chat(chat.chat_template, messages, chat.tokens, true);
  } catch (const std::invalid_argument& e) {
    throw UsageError(where + ": \"messages\": " + e.what());
  }
}

template <class T>
T number_or(const json& line, const char* key, T fallback, const std::string& where) {
  if (!line.contains(key)) return fallback;
  if (!line[key].is_number()) throw UsageError(where + ": \"" + key + "\" is not a number");
  return line[key].get<T>();
}

model::BatchRequest request_of(const json& line, const std::string& where, const BatchInferOptions& o,
                               const model::LoadedTokenizer& loaded, const std::vector<int>& stop_ids, int seq_len) {
  if (!line.is_object()) throw UsageError(where + ": not a JSON object");
  model::BatchRequest r;
  // A chat template writes its own beginning-of-sequence text.
  r.prompt = loaded.tokenizer->encode_text(prompt_text(line, where, loaded), !line.contains("messages"));
  if (r.prompt.empty() || static_cast<int>(r.prompt.size()) >= seq_len)
    throw UsageError(where + ": the prompt is " + std::to_string(r.prompt.size()) + " tokens; the context holds " +
                     std::to_string(seq_len));
  r.max_tokens = number_or(line, "max_tokens", o.max_tokens, where);
  r.temperature = number_or(line, "temperature", o.temperature, where);
  r.topp = number_or(line, "top_p", o.topp, where);
  r.seed = number_or<unsigned long long>(line, "seed", o.seed, where);
  if (r.max_tokens < 1) throw UsageError(where + ": \"max_tokens\" must be >= 1");
  if (!(r.temperature >= 0) || !(r.topp >= 0 && r.topp <= 1))
    throw UsageError(where + ": \"temperature\" must be >= 0 and \"top_p\" in [0, 1]");
  if (r.seed == 0) r.seed = 1;  // the sampler's xorshift state must not be 0
  r.stop_ids = stop_ids;
  return r;
}

std::vector<model::BatchRequest> read_requests(const BatchInferOptions& o, const model::LoadedTokenizer& loaded,
                                               const std::vector<int>& stop_ids, int seq_len) {
  std::ifstream in(o.jsonl);
  if (!in) throw UsageError("--batch " + o.jsonl + ": cannot open");
  std::vector<model::BatchRequest> requests;
  std::string text;
  for (int n = 1; std::getline(in, text); ++n) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = o.jsonl + ":" + std::to_string(n);
    json line;
    try {
      line = json::parse(text);
    } catch (const json::parse_error& e) {
      throw UsageError(where + ": not JSON (" + std::string(e.what()).substr(0, 120) + ")");
    }
    requests.push_back(request_of(line, where, o, loaded, stop_ids, seq_len));
  }
  if (requests.empty()) throw UsageError("--batch " + o.jsonl + ": no prompts");
  return requests;
}

// The text the generated ids add to the prompt's: decoded after the prompt, so a first token's
// leading space (SentencePiece's "▁") is kept as it would be in the whole text.
std::string continuation(const model::TokenizerInterface& tokenizer, const std::vector<int>& prompt,
                         std::span<const int> generated) {
  std::vector<int> all = prompt;
  all.insert(all.end(), generated.begin(), generated.end());
  const std::string whole = tokenizer.decode_ids(all, false), before = tokenizer.decode_ids(prompt, false);
  return whole.starts_with(before) ? whole.substr(before.size()) : tokenizer.decode_ids(generated, false);
}

}  // namespace

void run_infer_batch(const BatchInferOptions& o, const OpenedModel& opened, const dist::Mesh& mesh,
                     const dist::RunOptions& run_options) {
  if (o.parallel < 1) throw UsageError("--parallel " + std::to_string(o.parallel) + " must be >= 1");
  const model::LlamaConfig& config = opened.weights->config();
  const model::LoadedTokenizer loaded = open_tokenizer(o.tokenizer_path, std::nullopt);
  std::vector<int> stop_ids = opened.eos_token_ids;
  if (auto eos = loaded.tokenizer->token_id(loaded.tokenizer->eos_text()); eos && !loaded.tokenizer->eos_text().empty())
    stop_ids.push_back(*eos);
  const std::vector<model::BatchRequest> requests = read_requests(o, loaded, stop_ids, config.seq_len);
  std::vector<model::BatchResult> results;
  std::atomic<size_t> finished{0};
  dist::run_on_mesh(
      mesh,
      [&](dist::Device& dev) {
        model::Llama llama = model::Llama::on_huge_pages(*opened.weights, dev.axis("model"), dev.axis("expert"));
        const bool reporter = dev.rank() == 0;
        std::vector<model::BatchResult> r = model::generate_batch(llama, requests, o.parallel, [&](size_t) {
          if (!reporter) return;
          std::fprintf(stderr, "\r%zu/%zu done", ++finished, requests.size());
        });
        if (reporter) results = std::move(r);
      },
      run_options);
  std::fprintf(stderr, "\n");
  for (size_t i = 0; i < results.size(); ++i) {
    std::span<const int> generated = results[i].tokens;
    if (results[i].finish_reason == "stop") generated = generated.first(generated.size() - 1);  // not the stop token
    const json out = {{"index", i},
                      {"text", continuation(*loaded.tokenizer, requests[i].prompt, generated)},
                      {"tokens", results[i].tokens.size()},
                      {"finish_reason", results[i].finish_reason}};
    std::printf("%s\n", out.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
  }
}

}  // namespace tpcli::cli
