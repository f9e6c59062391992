// tpcli bench serve (--url URL | --model M [serve flags...]) [--clients 1,4,16,64] [--prompt-tokens 128] [--max-tokens 128]
//                   [--requests-per-client 4] [--model-name NAME] [--api-key KEY] [--seed S] [--json-schema FILE]
// A load benchmark of any OpenAI-compatible server (tpcli serve, llama-server, vLLM), read like vLLM's
// benchmark_serving with --max-concurrency: for each count C of --clients, C threads each send
// --requests-per-client streaming POST /v1/completions back to back (a closed loop). Prompts are
// random token ids in [100, 500) from --seed, so every server gets the same work and no tokenizer
// decides its length; `ignore_eos` makes every request generate exactly --max-tokens. Each SSE event
// is timestamped as it arrives: TTFT = request sent to first text, ITL = gaps between later text
// events. One row per C: requests/s, output tokens/s over the level's wall time, its ratio to
// 1 client, TTFT and ITL mean / p50 / p99 in ms (numpy's percentiles), and the failed requests.
// With --model instead of --url, the benchmark starts `tpcli serve --model M` itself (this binary, a
// free port, every flag it does not know passed on, e.g. --devices 2 --parallel 16) and stops it after.
// With --json-schema FILE, each level runs twice in a row, the requests first plain and then with
// the schema as their response_format (prompts of their own: a server's prefix cache must not give
// the second run the first one's prefills): two rows and the constrained level's
// output rate as a ratio of the plain one's, the cost of constrained decoding under load. A
// constrained answer may end before --max-tokens (its schema complete): the rate counts the tokens
// each usage chunk reports.
#include <CLI/CLI.hpp>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "cli/serve_child.h"
#include "perf/serve_load.h"

namespace tpcli::cli {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int PROMPT_ID_MIN = 100, PROMPT_ID_END = 500;  // plain word pieces in a Llama vocabulary, in any 32k one

struct ServeBenchFlags {
  std::string url, model;              // one of the two: a running server, or a model to serve here
  std::vector<std::string> serve_args;  // the flags bench serve does not know, for the child tpcli serve
  int ready_s = 600;                    // for --model: how long loading the model may take
  std::vector<int> clients{1, 4, 16, 64};
  int prompt_tokens = 128, max_tokens = 128, requests_per_client = 4;
  std::string model_name, api_key;
  unsigned seed = 1;
  int timeout_s = 600;
  int busy_ttft = 0;  // tokens of the long prompt whose first token is timed alone and under load (0: not run)
  std::string json_schema_file;
  nlohmann::json response_format;  // from --json-schema; null: requests unconstrained
};

struct RequestResult {
  std::optional<std::string> error;  // why it failed; unset for a success
  std::optional<double> ttft_s;
  std::vector<double> itl_s;
  int output_tokens = 0;
};

struct LevelResult {
  int clients = 0, requests = 0, errors = 0;
  std::string first_error;
  double seconds = 0;
  int64_t output_tokens = 0;
  std::vector<double> ttft_s, itl_s;
};

httplib::Headers auth_headers(const std::string& api_key) {
  if (api_key.empty()) return {};
  return {{"Authorization", "Bearer " + api_key}};
}

// One client connection (one per thread: httplib::Client is not shared between threads).
std::unique_ptr<httplib::Client> connect(const ServeBenchFlags& f) {
  auto client = std::make_unique<httplib::Client>(f.url);
  if (!client->is_valid()) throw UsageError("--url " + f.url + ": not a URL of the form http://HOST:PORT");
  client->set_connection_timeout(5);
  client->set_read_timeout(f.timeout_s);
  client->set_write_timeout(f.timeout_s);
  return client;
}

// GET /v1/models: proves the server answers (else a one-line error) and names its model.
std::string discover_model_name(const ServeBenchFlags& f) {
  auto client = connect(f);
  const httplib::Result res = client->Get("/v1/models", auth_headers(f.api_key));
  if (!res)
    throw std::runtime_error("bench serve: cannot reach " + f.url + " (httplib: " + httplib::to_string(res.error()) +
                             "): is a server listening there?");
  if (res->status != 200)
    throw std::runtime_error("bench serve: GET " + f.url + "/v1/models answered " + std::to_string(res->status) + ": " +
                             res->body.substr(0, 200));
  const auto models = nlohmann::json::parse(res->body, nullptr, false);
  if (models.is_discarded() || !models.contains("data") || !models["data"].is_array() || models["data"].empty() ||
      !models["data"][0].contains("id"))
    throw std::runtime_error("bench serve: GET /v1/models gave no model id: " + res->body.substr(0, 200));
  return models["data"][0]["id"].get<std::string>();
}

// Request `index` of level `level`: its own prompt, so a server's prefix cache finds nothing shared
// between requests (1 in 400 share a first token), and the same one for every server.
std::vector<int> make_prompt(const ServeBenchFlags& f, int level, int index, int tokens = 0) {
  std::mt19937 rng(f.seed * 1000003u + static_cast<unsigned>(level) * 10007u + static_cast<unsigned>(index));
  std::uniform_int_distribution<int> pick(PROMPT_ID_MIN, PROMPT_ID_END - 1);
  std::vector<int> prompt(static_cast<size_t>(tokens > 0 ? tokens : f.prompt_tokens));
  for (int& t : prompt) t = pick(rng);
  return prompt;
}

std::string request_body(const ServeBenchFlags& f, const std::string& model, const std::vector<int>& prompt, int max_tokens = 0,
                         const nlohmann::json& response_format = nullptr) {
  nlohmann::json body{{"model", model},
                      {"prompt", prompt},
                      {"max_tokens", max_tokens > 0 ? max_tokens : f.max_tokens},
                      {"temperature", 0},
                      {"ignore_eos", true},
                      {"stream", true},
                      {"stream_options", {{"include_usage", true}}}};
  if (!response_format.is_null()) body["response_format"] = response_format;
  return body.dump();
}

// --json-schema FILE as a response_format; a one-line error naming the file when it is not JSON.
nlohmann::json read_response_format(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw UsageError("--json-schema " + path + ": cannot read the file");
  const nlohmann::json schema = nlohmann::json::parse(in, nullptr, false);
  if (schema.is_discarded() || !(schema.is_object() || schema.is_boolean()))
    throw UsageError("--json-schema " + path + ": not a JSON schema (a JSON object)");
  return {{"type", "json_schema"}, {"json_schema", {{"name", "bench"}, {"schema", schema}, {"strict", true}}}};
}

// Applies one event to the request's timings: text events are tokens (ITL is measured between them).
void record_event(const perf::StreamEvent& e, Clock::time_point sent, Clock::time_point now,
                  std::optional<Clock::time_point>& last_token, int& token_events, RequestResult& r) {
  if (e.error_message && !r.error) r.error = "error event: " + *e.error_message;
  if (e.completion_tokens) r.output_tokens = *e.completion_tokens;
  if (!e.has_text) return;
  ++token_events;
  if (last_token) r.itl_s.push_back(std::chrono::duration<double>(now - *last_token).count());
  else r.ttft_s = std::chrono::duration<double>(now - sent).count();
  last_token = now;
}

// One streaming completion, timed event by event as the chunks arrive.
RequestResult run_request(httplib::Client& client, const ServeBenchFlags& f, const std::string& body) {
  RequestResult r;
  perf::SseSplitter splitter;
  std::string error_body;  // a non-200 answer's body, for the message
  int status = 0, token_events = 0;
  std::optional<Clock::time_point> last_token;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.headers = auth_headers(f.api_key);
  req.set_header("Content-Type", "application/json");
  req.body = body;
  req.response_handler = [&](const httplib::Response& res) {
    status = res.status;
    return true;
  };
  const Clock::time_point sent = Clock::now();
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    const Clock::time_point now = Clock::now();  // one timestamp per chunk: events in it arrived together
    if (status != 200) {
      error_body.append(data, std::min<size_t>(n, 300));
      return true;
    }
    try {
      for (const std::string& payload : splitter.feed(std::string_view(data, n)))
        record_event(perf::parse_stream_event(payload), sent, now, last_token, token_events, r);
    } catch (const std::exception& e) {  // not through httplib's reader: cancel the request instead
      r.error = e.what();
      return false;
    }
    return true;
  };
  const httplib::Result res = client.send(req);
  if (!res && !r.error) r.error = "httplib error " + httplib::to_string(res.error()) + " (the connection failed or closed mid-answer)";
  else if (status != 200) r.error = "HTTP " + std::to_string(status) + ": " + error_body.substr(0, 300);
  else if (!r.ttft_s && !r.error && r.output_tokens == 0) r.error = "the stream carried no text";
  if (r.output_tokens == 0) r.output_tokens = token_events;  // no usage chunk: one token per text event
  return r;
}

void add_request(const RequestResult& r, LevelResult& out) {
  ++out.requests;
  if (r.error) {
    if (out.errors++ == 0) out.first_error = *r.error;
    return;
  }
  out.output_tokens += r.output_tokens;
  if (r.ttft_s) out.ttft_s.push_back(*r.ttft_s);  // tokens without text (a random model's padding rows) have no first text
  out.itl_s.insert(out.itl_s.end(), r.itl_s.begin(), r.itl_s.end());
}

// C clients, each running its requests back to back; the level's wall time spans them all.
LevelResult run_level(const ServeBenchFlags& f, const std::string& model, int level, int clients,
                      const nlohmann::json& response_format = nullptr) {
  LevelResult out;
  out.clients = clients;
  std::mutex mutex;
  std::vector<std::thread> threads;
  const Clock::time_point start = Clock::now();
  for (int c = 0; c < clients; ++c)
    threads.emplace_back([&, c] {
      auto client = connect(f);
      for (int i = 0; i < f.requests_per_client; ++i) {
        const std::string body = request_body(f, model, make_prompt(f, level, c * f.requests_per_client + i), 0, response_format);
        RequestResult r;
        try {
          r = run_request(*client, f, body);
        } catch (const std::exception& e) {  // an exception may not leave a std::thread
          r.error = e.what();
        }
        std::lock_guard<std::mutex> lock(mutex);
        add_request(r, out);
      }
    });
  for (auto& t : threads) t.join();
  out.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return out;
}

// Time to first token of a --busy-ttft prompt, alone and then while `streams` other requests
// decode (closed-loop clients kept running): what chunked prefill must keep near the idle figure.
constexpr int BUSY_TTFT_ROUNDS = 3;
constexpr int BUSY_TTFT_LEVEL = 1000;  // prompt seeds apart from the levels'

std::vector<double> long_prompt_ttfts(const ServeBenchFlags& f, const std::string& model, int first_index) {
  std::vector<double> out;
  auto client = connect(f);
  for (int i = 0; i < BUSY_TTFT_ROUNDS; ++i) {
    const RequestResult r = run_request(*client, f, request_body(f, model, make_prompt(f, BUSY_TTFT_LEVEL, first_index + i, f.busy_ttft), 1));
    if (r.error) throw std::runtime_error("bench serve --busy-ttft: " + *r.error);
    if (!r.ttft_s) throw std::runtime_error("bench serve --busy-ttft: the answer carried no text to time");
    out.push_back(*r.ttft_s);
  }
  return out;
}

void run_busy_ttft(const ServeBenchFlags& f, const std::string& model, int streams) {
  const double idle = perf::summarize(long_prompt_ttfts(f, model, 0)).p50;
  std::atomic<bool> stop{false};
  std::atomic<int> decoding{0};
  std::vector<std::thread> background;
  for (int c = 0; c < streams; ++c)
    background.emplace_back([&, c] {
      auto client = connect(f);
      bool counted = false;
      for (int i = 0; !stop; ++i) {
        try {
          run_request(*client, f, request_body(f, model, make_prompt(f, BUSY_TTFT_LEVEL + 1 + c, i)));
        } catch (const std::exception&) {  // counted as missing below
        }
        if (!counted) {
          counted = true;
          ++decoding;
        }
      }
    });
  // Measured once every background client has finished a first request: all of them decoding.
  while (decoding < streams) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const double busy = perf::summarize(long_prompt_ttfts(f, model, BUSY_TTFT_ROUNDS)).p50;
  stop = true;
  for (auto& t : background) t.join();
  std::printf("time to first token of a %d-token prompt (p50 of %d): alone %.1f ms, beside %d decoding streams %.1f ms (%.2fx)\n",
              f.busy_ttft, BUSY_TTFT_ROUNDS, idle * 1e3, streams, busy * 1e3, busy / idle);
}

void print_header(const ServeBenchFlags& f, const std::string& model) {
  std::printf("server %s, model %s: %d prompt tokens (random ids in [%d, %d), seed %u), %d generated (ignore_eos), "
              "%d requests per client, streamed%s\n"
              "| clients | requests | failed |  req/s | out tok/s | vs 1 client | TTFT mean ms | p50 ms | p99 ms "
              "| ITL mean ms | p50 ms | p99 ms |\n"
              "|---------|----------|--------|--------|-----------|-------------|--------------|--------|--------"
              "|-------------|--------|--------|\n",
              f.url.c_str(), model.c_str(), f.prompt_tokens, PROMPT_ID_MIN, PROMPT_ID_END, f.seed, f.max_tokens,
              f.requests_per_client,
              f.response_format.is_null() ? "" : ("; each level plain, then with --json-schema " + f.json_schema_file + " (rows +schema)").c_str());
}

// One row; `one_client_tok_s` is the 1-client level's output rate (unset until it ran).
void print_level(const LevelResult& r, std::optional<double> one_client_tok_s, const char* label = "") {
  const double ok = r.requests - r.errors, tok_s = static_cast<double>(r.output_tokens) / r.seconds;
  const perf::LatencySummary ttft = perf::summarize(r.ttft_s), itl = perf::summarize(r.itl_s);
  char ratio[32] = "-";
  if (one_client_tok_s && *one_client_tok_s > 0) std::snprintf(ratio, sizeof ratio, "%.2fx", tok_s / *one_client_tok_s);
  const std::string clients = std::to_string(r.clients) + label;
  std::printf("| %7s | %8d | %6d | %6.2f | %9.1f | %11s | %12.1f | %6.1f | %6.1f | %11.2f | %6.2f | %6.2f |\n", clients.c_str(),
              r.requests, r.errors, ok / r.seconds, tok_s, ratio, ttft.mean * 1e3, ttft.p50 * 1e3,
              ttft.p99 * 1e3, itl.mean * 1e3, itl.p50 * 1e3, itl.p99 * 1e3);
  if (r.errors) std::printf("  %d of %d requests failed; the first: %s\n", r.errors, r.requests, r.first_error.c_str());
  std::fflush(stdout);
}

constexpr int CONSTRAINED_LEVEL_SEEDS = 500;  // prompt seeds apart from the plain levels' (and --busy-ttft's)

// The level again with the schema: its row, and its output rate against the plain level's.
void print_constrained_level(const ServeBenchFlags& f, const std::string& model, int level, const LevelResult& plain) {
  const LevelResult r = run_level(f, model, level + CONSTRAINED_LEVEL_SEEDS, plain.clients, f.response_format);
  print_level(r, std::nullopt, "+schema");
  const double plain_tok_s = static_cast<double>(plain.output_tokens) / plain.seconds;
  const double schema_tok_s = static_cast<double>(r.output_tokens) / r.seconds;
  std::printf("  %d clients with a JSON schema each: %.1f out tok/s, %.2fx the plain level's %.1f (%.1f tokens per answer, plain %.1f)\n",
              plain.clients, schema_tok_s, schema_tok_s / plain_tok_s, plain_tok_s,
              static_cast<double>(r.output_tokens) / std::max(1, r.requests - r.errors),
              static_cast<double>(plain.output_tokens) / std::max(1, plain.requests - plain.errors));
  std::fflush(stdout);
}

void check_flags(ServeBenchFlags& f) {
  if (f.url.empty() == f.model.empty()) throw UsageError("give one of --url (a running server) and --model (serve it here)");
  if (!f.json_schema_file.empty()) f.response_format = read_response_format(f.json_schema_file);
  if (!f.serve_args.empty() && f.model.empty())
    throw UsageError("unknown flag(s) for bench serve --url: " + f.serve_args.front() + " (passed to tpcli serve only with --model)");
  if (!f.model.empty()) return;  // the URL is the child's, made below
  while (!f.url.empty() && f.url.back() == '/') f.url.pop_back();
  if (f.url.rfind("http://", 0) != 0 && f.url.rfind("https://", 0) != 0)
    throw UsageError("--url " + f.url + ": give the server's base URL, e.g. http://127.0.0.1:8080");
  for (int c : f.clients)
    if (c < 1 || c > 1024) throw UsageError("--clients " + std::to_string(c) + ": client counts must be in [1, 1024]");
  if (f.prompt_tokens < 1 || f.max_tokens < 1 || f.requests_per_client < 1)
    throw UsageError("--prompt-tokens, --max-tokens and --requests-per-client must be >= 1");
}

void run_bench_serve(ServeBenchFlags f) {
  check_flags(f);
  std::unique_ptr<ServeChild> child;
  if (!f.model.empty()) {
    child = std::make_unique<ServeChild>(f.model, f.serve_args, f.ready_s);
    f.url = child->url();
  }
  const std::string model = f.model_name.empty() ? discover_model_name(f) : f.model_name;
  if (!f.model_name.empty()) discover_model_name(f);  // still fail in one line when nothing answers
  print_header(f, model);
  std::optional<double> one_client_tok_s;
  for (size_t level = 0; level < f.clients.size(); ++level) {
    const LevelResult r = run_level(f, model, static_cast<int>(level), f.clients[level]);
    if (f.clients[level] == 1 && r.seconds > 0) one_client_tok_s = static_cast<double>(r.output_tokens) / r.seconds;
    print_level(r, one_client_tok_s);
    if (!f.response_format.is_null()) print_constrained_level(f, model, static_cast<int>(level), r);
  }
  if (f.busy_ttft > 0) run_busy_ttft(f, model, *std::max_element(f.clients.begin(), f.clients.end()) - 1);
}

void setup_bench_serve(CLI::App& sub) {
  auto f = std::make_shared<ServeBenchFlags>();
  sub.add_option("--url", f->url, "base URL of a running OpenAI-compatible server (tpcli serve, llama-server, vLLM)");
  sub.add_option("--model", f->model, "instead of --url: run tpcli serve --model M here (other flags are passed to it)");
  sub.add_option("--ready-timeout", f->ready_s, "with --model: seconds to wait for the server's /health")->capture_default_str();
  sub.allow_extras();
  sub.add_option("--clients", f->clients, "concurrent clients, one row each")->delimiter(',')->capture_default_str();
  sub.add_option("--prompt-tokens", f->prompt_tokens, "prompt length in tokens (random ids)")->capture_default_str();
  sub.add_option("--max-tokens", f->max_tokens, "tokens generated per request (ignore_eos)")->capture_default_str();
  sub.add_option("--requests-per-client", f->requests_per_client, "requests each client sends back to back")
      ->capture_default_str();
  sub.add_option("--model-name", f->model_name, "the request's \"model\" field (default: the first of GET /v1/models)");
  sub.add_option("--api-key", f->api_key, "sent as Authorization: Bearer KEY");
  sub.add_option("--seed", f->seed, "seed of the random prompts")->capture_default_str();
  sub.add_option("--busy-ttft", f->busy_ttft,
                 "then: time to first token of a prompt of this many tokens, alone and beside (largest --clients - 1) "
                 "decoding streams");
  sub.add_option("--json-schema", f->json_schema_file,
                 "a JSON schema file: each level runs again with it as every request's response_format, and prints the ratio");
  sub.add_option("--timeout", f->timeout_s, "seconds a request may take before it counts as failed")->capture_default_str();
  sub.callback([f, &sub] {
    f->serve_args = sub.remaining();
    run_bench_serve(*f);
  });
}

const bool registered = register_bench(
    {"serve", "load an OpenAI-compatible server with concurrent streaming clients: benchmark_serving's figures",
     setup_bench_serve});

}  // namespace

}  // namespace tpcli::cli
