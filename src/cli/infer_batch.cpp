// tpcli::cli — infer --batch (see infer_batch.h).
#include "cli/infer_batch.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>
#include <span>

#include "cli/commands.h"
#include "cli/tokenizer_setup.h"
#include "model/batch_engine.h"
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

// A line's request and its stop strings.
struct Job {
  model::BatchRequest request;
  std::vector<std::string> stop;
};

std::vector<std::string> stop_strings(const json& line, const std::string& where) {
  if (!line.contains("stop")) return {};
  const json& stop = line["stop"];
  std::vector<std::string> out;
  if (stop.is_string()) out.push_back(stop.get<std::string>());
  else if (stop.is_array() && std::ranges::all_of(stop, [](const json& s) { return s.is_string(); }))
    for (const json& s : stop) out.push_back(s.get<std::string>());
  else throw UsageError(where + ": \"stop\" is not a string or a list of strings");
  if (std::ranges::any_of(out, [](const std::string& s) { return s.empty(); })) throw UsageError(where + ": \"stop\" holds an empty string");
  return out;
}

Job job_of(const json& line, const std::string& where, const BatchInferOptions& o, const model::LoadedTokenizer& loaded,
           const std::vector<int>& stop_ids, int context) {
  if (!line.is_object()) throw UsageError(where + ": not a JSON object");
  Job job{{}, stop_strings(line, where)};
  model::BatchRequest& r = job.request;
  // A chat template writes its own beginning-of-sequence text.
  r.prompt = loaded.tokenizer->encode_text(prompt_text(line, where, loaded), !line.contains("messages"));
  if (r.prompt.empty() || static_cast<int>(r.prompt.size()) >= context)
    throw UsageError(where + ": the prompt is " + std::to_string(r.prompt.size()) + " tokens; the context holds " +
                     std::to_string(context));
  r.max_tokens = number_or(line, "max_tokens", o.max_tokens, where);
  r.temperature = number_or(line, "temperature", o.temperature, where);
  r.topp = number_or(line, "top_p", o.topp, where);
  r.seed = number_or<unsigned long long>(line, "seed", o.seed, where);
  if (r.max_tokens < 1) throw UsageError(where + ": \"max_tokens\" must be >= 1");
  if (!(r.temperature >= 0) || !(r.topp >= 0 && r.topp <= 1))
    throw UsageError(where + ": \"temperature\" must be >= 0 and \"top_p\" in [0, 1]");
  if (r.seed == 0) r.seed = 1;  // the sampler's xorshift state must not be 0
  r.stop_ids = stop_ids;
  return job;
}

std::vector<Job> read_jobs(const BatchInferOptions& o, const model::LoadedTokenizer& loaded, const std::vector<int>& stop_ids,
                           int context) {
  std::ifstream in(o.jsonl);
  if (!in) throw UsageError("--batch " + o.jsonl + ": cannot open");
  std::vector<Job> jobs;
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
    jobs.push_back(job_of(line, where, o, loaded, stop_ids, context));
  }
  if (jobs.empty()) throw UsageError("--batch " + o.jsonl + ": no prompts");
  return jobs;
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

// Where the text first meets one of the stop strings (npos: nowhere).
size_t first_stop(const std::string& text, const std::vector<std::string>& stop) {
  size_t at = std::string::npos;
  for (const std::string& s : stop) at = std::min(at, text.find(s));
  return at;
}

void print_progress(size_t done, size_t total, int64_t tokens) {
  constexpr int WIDTH = 30;
  const int filled = static_cast<int>(WIDTH * done / std::max<size_t>(total, 1));
  std::fprintf(stderr, "\r[%s%s] %zu/%zu requests, %lld tokens", std::string(static_cast<size_t>(filled), '#').c_str(),
               std::string(static_cast<size_t>(WIDTH - filled), ' ').c_str(), done, total, static_cast<long long>(tokens));
}

// Runs every job on this device's engine; the results in job order.
std::vector<model::BatchResult> run_jobs(model::Llama& llama, const std::vector<Job>& jobs, const BatchInferOptions& o,
                                         const model::TokenizerInterface& tokenizer, bool reporter) {
  model::BatchEngine engine(llama, o.engine);
  for (const Job& j : jobs) engine.add(j.request);
  engine.on_token = [&](int id, int) {  // the same answer on every device: the same tokens
    const Job& j = jobs[static_cast<size_t>(id)];
    return j.stop.empty() || first_stop(continuation(tokenizer, j.request.prompt, engine.result(id).tokens), j.stop) == std::string::npos;
  };
  size_t finished = 0;
  int64_t tokens = 0;
  if (reporter)
    engine.on_finished = [&](int id) { print_progress(++finished, jobs.size(), tokens += static_cast<int64_t>(engine.result(id).tokens.size())); };
  const auto start = std::chrono::steady_clock::now();
  while (engine.step()) {
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const model::EngineStats& st = engine.stats();
  if (reporter)
    std::fprintf(stderr,
                 "\n%lld tokens generated in %.2f s (%.1f tok/s), %lld rows in %lld steps; %lld prompt tokens from the "
                 "prefix cache, %lld preemptions; KV pool %d blocks, %.1f MB per device\n",
                 static_cast<long long>(tokens), seconds, static_cast<double>(tokens) / seconds, static_cast<long long>(st.rows),
                 static_cast<long long>(st.steps), static_cast<long long>(st.cached_tokens), static_cast<long long>(st.preemptions),
                 engine.kv_blocks(), static_cast<double>(engine.kv_pool_bytes()) / 1e6);
  std::vector<model::BatchResult> results;
  for (size_t i = 0; i < jobs.size(); ++i) results.push_back(engine.result(static_cast<int>(i)));
  return results;
}

json result_line(size_t i, const Job& job, const model::BatchResult& r, const model::TokenizerInterface& tokenizer) {
  std::span<const int> generated = r.tokens;
  const bool stop_id = r.finish_reason == "stop" && !generated.empty() &&
                       std::ranges::find(job.request.stop_ids, generated.back()) != job.request.stop_ids.end();
  if (stop_id) generated = generated.first(generated.size() - 1);  // not the stop token
  std::string text = continuation(tokenizer, job.request.prompt, generated);
  if (const size_t at = first_stop(text, job.stop); at != std::string::npos) text.resize(at);  // not the stop string
  return {{"index", i}, {"text", text}, {"tokens", r.tokens.size()}, {"finish_reason", r.finish_reason}};
}

}  // namespace

void run_infer_batch(const BatchInferOptions& o, const OpenedModel& opened, const dist::Mesh& mesh,
                     const dist::RunOptions& run_options) {
  if (o.engine.parallel < 1) throw UsageError("--parallel " + std::to_string(o.engine.parallel) + " must be >= 1");
  if (o.engine.step_tokens < 1) throw UsageError("--step-tokens " + std::to_string(o.engine.step_tokens) + " must be >= 1");
  if (o.engine.kv_blocks < 0) throw UsageError("--kv-blocks " + std::to_string(o.engine.kv_blocks) + " must be >= 1");
  const model::LlamaConfig& config = opened.weights->config();
  int64_t pool_positions = 0;
  try {
    pool_positions = int64_t{model::kv_pool_blocks(config, mesh.axis_size("model"), mesh.size(), o.engine)} * o.engine.block_size;
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  const int context = static_cast<int>(std::min<int64_t>(config.seq_len, pool_positions));
  const model::LoadedTokenizer loaded = open_tokenizer(o.tokenizer_path, std::nullopt);
  std::vector<int> stop_ids = opened.eos_token_ids;
  if (auto eos = loaded.tokenizer->token_id(loaded.tokenizer->eos_text()); eos && !loaded.tokenizer->eos_text().empty())
    stop_ids.push_back(*eos);
  const std::vector<Job> jobs = read_jobs(o, loaded, stop_ids, context);
  std::vector<model::BatchResult> results;
  run_inference_model(opened, mesh, run_options, [&](model::Llama& llama, dist::Device& dev) {
    std::vector<model::BatchResult> r = run_jobs(llama, jobs, o, *loaded.tokenizer, dev.rank() == 0);
    if (dev.rank() == 0) results = std::move(r);
  });
  for (size_t i = 0; i < results.size(); ++i)
    std::printf("%s\n", result_line(i, jobs[i], results[i], *loaded.tokenizer).dump(-1, ' ', false, json::error_handler_t::replace).c_str());
}

}  // namespace tpcli::cli
