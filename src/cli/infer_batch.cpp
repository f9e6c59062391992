// tpcli::cli — infer --batch (see infer_batch.h).
#include "cli/infer_batch.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>

#include "cli/commands.h"
#include "cli/tokenizer_setup.h"
#include "engine/batch_engine.h"
#include "engine/end_of_generation.h"
#include "files/json_file.h"
#include "engine/grammar_constraint.h"
#include "files/line_reader.h"
#include "grammar/json_schema.h"
#include "model/llama.h"
#include "text/chat_template.h"

namespace tpcli::cli {

namespace {

using nlohmann::json;

// The keys a line may hold; any other is refused, as the server refuses them.
constexpr const char* LINE_KEYS[] = {"prompt", "messages", "max_tokens", "temperature", "top_p", "seed", "stop", "response_format", "grammar"};

void refuse_unknown_keys(const json& line, const std::string& where) {
  for (const auto& [key, value] : line.items()) {
    if (std::ranges::count(LINE_KEYS, key) || std::ranges::count(engine::SAMPLING_KEYS, key)) continue;
    std::string known;
    for (const char* k : LINE_KEYS) known += (known.empty() ? "" : ", ") + std::string(k);
    for (const char* k : engine::SAMPLING_KEYS) known += ", " + std::string(k);
    throw UsageError(where + ": unknown key " + files::quoted_value(key) + " (a line holds " + known + ")");
  }
}

template <class T>
T number_or(const json& line, const char* key, T fallback, const std::string& where) {
  if (!line.contains(key)) return fallback;
  if (!line[key].is_number()) throw UsageError(where + ": \"" + key + "\" is not a number");
  return line[key].get<T>();
}

// An integer key within [least, most]: a float or a value past the type's range is refused, not
// truncated or wrapped (4294967297 read as an int is 1).
int64_t integer_or(const json& line, const char* key, int64_t fallback, int64_t least, int64_t most, const std::string& where) {
  if (!line.contains(key)) return fallback;
  const json& v = line[key];
  const bool fits = v.is_number_unsigned() ? v.get<uint64_t>() <= static_cast<uint64_t>(most)
                                           : v.is_number_integer() && v.get<int64_t>() >= least && v.get<int64_t>() <= most;
  if (!fits)
    throw UsageError(where + ": \"" + key + "\" = " + v.dump() + " is not an integer in [" + std::to_string(least) + ", " +
                     std::to_string(most) + "]");
  return v.get<int64_t>();
}

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

// The --batch file's lines as jobs, one at a time: the file is never held whole, only the line
// being read (a 100,000-line file costs what its running lines cost).
class JobReader {
 public:
  JobReader(const BatchInferOptions& o, const text::LoadedTokenizer& loaded, const std::vector<int>& stop_ids, int context, int vocab)
      : o_(o), loaded_(loaded), stop_ids_(stop_ids), context_(context), vocab_(vocab), lines_(open(o.jsonl)) {}

  // The next non-blank line's job; nullopt at the end of the file. A bad line is a UsageError
  // naming FILE:LINE and the key.
  std::optional<engine::BatchRequest> next() {
    std::string text;
    try {
      while (lines_.next(text))
        if (text.find_first_not_of(" \t\r") != std::string::npos) return job_of(parse(text), text);
    } catch (const std::runtime_error& e) {  // a line past the bound
      throw UsageError(e.what());
    }
    return std::nullopt;
  }

 private:
  static files::LineReader open(const std::string& path) {
    try {
      return files::LineReader(path, "a JSONL file of prompts (--batch)");
    } catch (const std::runtime_error& e) {
      throw UsageError(e.what());
    }
  }

  json parse(const std::string& text) const {
    try {
      return files::parse_json_text(text, lines_.where());  // depth-bounded: a line may be hostile
    } catch (const std::exception& e) {
      throw UsageError(std::string(e.what()).substr(0, 300));
    }
  }

  // A line's text to generate from: its prompt, or its messages through the chat template.
  std::string prompt_text(const json& line) {
    const std::string where = lines_.where();
    if (line.contains("prompt")) {
      if (!line["prompt"].is_string()) throw UsageError(where + ": \"prompt\" is not a string");
      return line["prompt"].get<std::string>();
    }
    if (!line.contains("messages")) throw UsageError(where + ": needs \"prompt\" or \"messages\"");
    const std::vector<text::ChatMessage> messages = parse_messages(line["messages"].dump(), where + ": \"messages\"");
    if (!chat_) chat_ = chat_formatting(loaded_, o_.chat_template);  // recognised once, at the first chat line
    try {
      return text::render_chat(chat_->chat_template, messages, chat_->tokens, true);
    } catch (const std::invalid_argument& e) {
      throw UsageError(where + ": \"messages\": " + e.what());
    }
  }

  // The GBNF a line's answer must follow ("": none): its `grammar`, or its response_format as the
  // server reads it (json_object, json_schema with the schema's properties in the line's order).
  std::string output_grammar(const json& line, const std::string& text, const std::string& where) const {
    if (line.contains("grammar") && line.contains("response_format"))
      throw UsageError(where + ": \"grammar\" and \"response_format\" cannot both be given");
    if (line.contains("grammar")) {
      if (!line["grammar"].is_string() || line["grammar"].get_ref<const std::string&>().empty())
        throw UsageError(where + ": \"grammar\" must be a GBNF grammar (a string)");
      return line["grammar"].get<std::string>();
    }
    if (!line.contains("response_format")) return {};
    const nlohmann::ordered_json format = nlohmann::ordered_json::parse(text)["response_format"];  // depth checked by parse()
    const std::string type = format.is_object() ? format.value("type", "") : "";
    if (type == "text") return {};
    if (type == "json_object") return grammar::json_object_gbnf();
    if (type != "json_schema" || !format.contains("json_schema") || !format["json_schema"].is_object())
      throw UsageError(where + ": \"response_format\" must be {\"type\": \"text\" | \"json_object\" | \"json_schema\", \"json_schema\": {\"schema\"}}");
    return grammar::json_schema_to_gbnf(format["json_schema"].value("schema", nlohmann::ordered_json::object()));
  }

  engine::BatchRequest job_of(const json& line, const std::string& text) {
    const std::string where = lines_.where();
    if (!line.is_object()) throw UsageError(where + ": not a JSON object");
    refuse_unknown_keys(line, where);
    engine::BatchRequest r;
    r.stop = stop_strings(line, where);
    // A chat template writes its own beginning-of-sequence text.
    r.prompt = loaded_.tokenizer->encode_text(prompt_text(line), !line.contains("messages"));
    if (r.prompt.empty() || static_cast<int>(r.prompt.size()) >= context_)
      throw UsageError(where + ": the prompt is " + std::to_string(r.prompt.size()) + " tokens; the context holds " +
                       std::to_string(context_));
    r.max_tokens = static_cast<int>(integer_or(line, "max_tokens", o_.max_tokens, 1, std::numeric_limits<int>::max(), where));
    r.temperature = number_or(line, "temperature", o_.temperature, where);
    r.topp = number_or(line, "top_p", o_.topp, where);
    // As the server: any 64-bit integer, a negative one wrapping as run.c's -s does.
    if (line.contains("seed") && !line["seed"].is_number_integer()) throw UsageError(where + ": \"seed\" is not an integer");
    r.seed = line.contains("seed") ? line["seed"].get<uint64_t>() : o_.seed;
    if (!(r.temperature >= 0) || !(r.topp >= 0 && r.topp <= 1))
      throw UsageError(where + ": \"temperature\" must be >= 0 and \"top_p\" in [0, 1]");
    if (r.seed == 0) r.seed = 1;  // the sampler's xorshift state must not be 0
    try {
      r.sampling = engine::read_sampling_params(line, vocab_, o_.sampling);  // the server's parser
    } catch (const engine::SamplingParamError& e) {
      throw UsageError(where + ": " + e.what());
    }
    r.stop_ids = stop_ids_;
    try {
      const std::string gbnf = output_grammar(line, text, where);
      if (!gbnf.empty()) {
        if (!grammars_) grammars_ = std::make_unique<engine::GrammarConstraints>(*loaded_.tokenizer);
        r.constraint = grammars_->compile(gbnf);
      }
    } catch (const std::invalid_argument& e) {  // a schema keyword or grammar that does not compile
      throw UsageError(where + ": " + std::string(e.what()).substr(0, 300));
    }
    return r;
  }

  const BatchInferOptions& o_;
  const text::LoadedTokenizer& loaded_;
  const std::vector<int>& stop_ids_;
  int context_;
  int vocab_;  // the model's: logit_bias ids below it
  files::LineReader lines_;
  std::optional<ChatFormatting> chat_;
  std::unique_ptr<engine::GrammarConstraints> grammars_;  // made at the first constrained line
};

// The file's jobs for the devices of this process, each line read and tokenized once: every device
// takes the same jobs in the same order (their engines schedule alike), and a job is dropped once
// each device has taken it, so the window holds about what one engine has waiting.
class SharedJobs {
 public:
  SharedJobs(JobReader& reader, const std::vector<int>& device_ranks) : reader_(reader) {
    for (const int r : device_ranks) taken_[r] = 0;
  }

  // Device `rank`'s next job (its own copy); nullopt at the end of the file.
  std::optional<engine::BatchRequest> next(int rank) {
    std::lock_guard lock(mutex_);
    size_t& taken = taken_.at(rank);
    while (taken >= first_ + window_.size()) {
      std::optional<engine::BatchRequest> job = ended_ ? std::nullopt : reader_.next();
      if (!job) {
        ended_ = true;
        return std::nullopt;
      }
      window_.push_back(std::move(*job));
    }
    engine::BatchRequest job = window_[taken - first_];
    ++taken;
    const auto slowest = std::ranges::min_element(taken_, {}, [](const auto& entry) { return entry.second; });
    for (; first_ < slowest->second; ++first_) window_.pop_front();
    return job;
  }

 private:
  JobReader& reader_;
  std::mutex mutex_;
  std::map<int, size_t> taken_;  // device rank -> jobs it has taken
  std::deque<engine::BatchRequest> window_;  // jobs first_, first_ + 1, ...
  size_t first_ = 0;
  bool ended_ = false;
};

// The chat template prompts may go through (--template, else the tokenizer's): its end-of-turn
// tokens end every line, as in serve. One that cannot be recognised is refused at the first chat
// line (JobReader), not here.
std::optional<ChatFormatting> model_chat(const BatchInferOptions& o, const text::LoadedTokenizer& loaded) {
  if (o.chat_template.name.empty() && !loaded.chat_template) return std::nullopt;
  try {
    return chat_formatting(loaded, o.chat_template);
  } catch (const UsageError&) {
    return std::nullopt;
  }
}

// Reads every line once before anything runs, so a bad line is refused before any generation;
// keeps nothing but the count.
size_t count_jobs(const BatchInferOptions& o, const text::LoadedTokenizer& loaded, const std::vector<int>& stop_ids, int context,
                  int vocab) {
  JobReader reader(o, loaded, stop_ids, context, vocab);
  size_t jobs = 0;
  while (reader.next()) ++jobs;
  if (jobs == 0) throw UsageError("--batch " + o.jsonl + ": no prompts");
  return jobs;
}

void print_progress(size_t done, size_t total, int64_t tokens) {
  constexpr int WIDTH = 30;
  const int filled = static_cast<int>(WIDTH * done / std::max<size_t>(total, 1));
  std::fprintf(stderr, "\r[%s%s] %zu/%zu requests, %lld tokens", std::string(static_cast<size_t>(filled), '#').c_str(),
               std::string(static_cast<size_t>(WIDTH - filled), ' ').c_str(), done, total, static_cast<long long>(tokens));
}

// The engine's text: without the stop token, cut before a stop string.
json result_line(size_t i, const engine::BatchResult& r) {
  json line = {{"index", i}, {"text", r.text}, {"tokens", r.tokens.size()}, {"finish_reason", engine::finish_reason_name(r.finish_reason)}};
  if (r.finish_reason == engine::FinishReason::error) line["error"] = r.error;
  return line;
}

// Result lines out in input order, each as soon as every earlier one is: a line that finishes
// before an earlier one waits here as its text only.
class OrderedPrinter {
 public:
  void add(size_t index, const json& line) {
    waiting_[index] = line.dump(-1, ' ', false, json::error_handler_t::replace);
    for (auto first = waiting_.begin(); first != waiting_.end() && first->first == next_; first = waiting_.erase(first), ++next_)
      std::printf("%s\n", first->second.c_str());
  }

 private:
  std::map<size_t, std::string> waiting_;  // by index
  size_t next_ = 0;                        // the index to print next
};

// Runs every line of the file on this device's engine, taking lines only as the engine has room
// for them and forgetting each as it finishes: memory follows --parallel, not the file's length.
// Device 0 (`reporter`) prints the results and the progress. Returns how many lines failed (their
// logits were not finite): the others run on.
size_t run_jobs(model::Llama& llama, SharedJobs& jobs, int rank, size_t total, const BatchInferOptions& o,
              const text::TokenizerInterface& tokenizer, bool reporter) {
  engine::BatchEngine engine(llama, o.engine, &tokenizer);  // it matches the stop strings, the same on every device
  std::vector<int> finished;  // in the last step
  engine.on_finished = [&](int id) { finished.push_back(id); };  // forgotten after the step, not inside it
  OrderedPrinter printer;
  size_t done = 0, failed = 0;
  int64_t tokens = 0;
  const auto start = std::chrono::steady_clock::now();
  for (bool more_lines = true;;) {
    // As many lines waiting as could be admitted at once, so the engine never waits for the file.
    while (more_lines && engine.waiting() < o.engine.parallel) {
      std::optional<engine::BatchRequest> job = jobs.next(rank);
      more_lines = job.has_value();
      if (more_lines) engine.add(std::move(*job));
    }
    if (!engine.step()) break;
    for (const int id : finished) {
      const engine::BatchResult& r = engine.result(id);
      tokens += static_cast<int64_t>(r.tokens.size());
      failed += r.finish_reason == engine::FinishReason::error;
      if (reporter) {
        printer.add(static_cast<size_t>(id), result_line(static_cast<size_t>(id), r));
        print_progress(++done, total, tokens);
      }
      engine.forget(id);
    }
    finished.clear();
  }
  std::fflush(stdout);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const engine::EngineStats& st = engine.stats();
  if (reporter)
    std::fprintf(stderr,
                 "\n%lld tokens generated in %.2f s (%.1f tok/s), %lld rows in %lld steps; %lld prompt tokens from the "
                 "prefix cache, %lld preemptions; KV pool %d blocks, %.1f MB per device\n",
                 static_cast<long long>(tokens), seconds, static_cast<double>(tokens) / seconds, static_cast<long long>(st.rows),
                 static_cast<long long>(st.steps), static_cast<long long>(st.cached_tokens), static_cast<long long>(st.preemptions),
                 engine.kv_blocks(), static_cast<double>(engine.kv_pool_bytes()) / 1e6);
  if (reporter && o.engine.speculation.guesses > 0)
    std::fprintf(stderr, "speculation: %lld of %lld guesses right\n", static_cast<long long>(st.guessed_right),
                 static_cast<long long>(st.guessed));
  return failed;
}

}  // namespace

void run_infer_batch(const BatchInferOptions& o, const OpenedModel& opened, const model::Placement& placement,
                     const dist::RunOptions& run_options) {
  const dist::Mesh& mesh = placement.mesh();
  if (o.engine.parallel < 1) throw UsageError("--parallel " + std::to_string(o.engine.parallel) + " must be >= 1");
  if (o.engine.step_tokens < 1) throw UsageError("--step-tokens " + std::to_string(o.engine.step_tokens) + " must be >= 1");
  if (o.engine.kv_blocks < 0) throw UsageError("--kv-blocks " + std::to_string(o.engine.kv_blocks) + " must be >= 1");
  const model::LlamaConfig& config = opened.weights->config();
  int64_t pool_positions = 0;
  try {
    pool_positions = int64_t{engine::kv_pool_blocks(config, placement.plans(), mesh.size(), o.engine)} * o.engine.block_size;
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  const int context = static_cast<int>(std::min<int64_t>(config.seq_len, pool_positions));
  const text::LoadedTokenizer loaded = open_model_tokenizer(o.tokenizer_path, config.vocab_size);
  const std::optional<ChatFormatting> chat = model_chat(o, loaded);
  const std::vector<int> stop_ids = engine::end_of_generation(*loaded.tokenizer, opened.eos_token_ids, chat ? &chat->chat_template : nullptr,
                                                             chat ? chat->tokens : text::ChatTokens{})
                                        .ids;
  const size_t total = count_jobs(o, loaded, stop_ids, context, config.vocab_size);
  std::atomic<size_t> failed{0};
  JobReader reader(o, loaded, stop_ids, context, config.vocab_size);
  std::vector<int> local_ranks = run_options.local_ranks;
  if (local_ranks.empty())  // every device in this process, as run_on_mesh
    for (int r = 0; r < mesh.size(); ++r) local_ranks.push_back(r);
  SharedJobs jobs(reader, local_ranks);
  model::run_placed(*opened.weights, placement, run_options, [&](model::Llama& llama, dist::Device& dev) {
    const size_t mine = run_jobs(llama, jobs, dev.rank(), total, o, *loaded.tokenizer, dev.rank() == 0);
    if (dev.rank() == 0) failed = mine;
  });
  if (failed > 0)
    throw std::runtime_error(o.jsonl + ": " + std::to_string(failed.load()) + " of " + std::to_string(total) +
                             " lines failed (their results say why under \"error\"); the others were answered");
}

}  // namespace tpcli::cli
