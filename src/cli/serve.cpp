// tpcli serve --model M [--devices N | --mesh ...] [--host 127.0.0.1] [--port 8080] [--parallel 16]
//             [--api-key KEY] [--template NAME] [--model-name NAME] [--kv-memory SIZE] ...
// The OpenAI API over the batched engine on a mesh (serve/http_server.h, serve/engine_service.h).
// The model loads once; the engine runs until SIGINT or SIGTERM, which stop accepting, let what
// runs finish within --grace seconds, cancel the rest, and exit 0. Under zmq or MPI the process of
// device 0 serves HTTP and every device runs the steps.
#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <pthread.h>
#include <thread>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "cli/model_file.h"
#include "cli/tokenizer_setup.h"
#include "engine/grammar_constraint.h"
#include "distributed/collective_watch.h"
#include "distributed/runtime.h"
#include "distributed/select_backend.h"
#include "engine/end_of_generation.h"
#include "model/llama.h"
#include "model/shard_plan.h"
#include "model/weights.h"
#include "serve/api_request.h"
#include "serve/http_server.h"
#include "tensor/packed_matrix.h"

namespace tpcli::cli {

namespace {

// The engine for interactive streams: a prompt's chunk beside decoding streams is kept small so
// their tokens keep coming (a step of 16 decode rows plus PREFILL_CHUNK prompt rows).
constexpr int PREFILL_CHUNK = 32;
// /health says the devices are stuck, not ok, once one of this process's devices has waited this
// long in one collective (a step's waits last milliseconds; a frozen peer's last until the backend's
// timeout ends the run).
constexpr std::chrono::seconds DEVICES_STUCK_AFTER{2};
engine::EngineOptions serving_engine() {
  engine::EngineOptions o;
  o.busy_prefill_tokens = PREFILL_CHUNK;
  return o;
}

struct ServeFlags {
  ChatTemplateFlags chat_template;
  std::string model, tokenizer, model_name, dtype = "auto", quantize, kv_memory, kv_dtype = "f32";
  std::string adapter;  // --adapter: a PEFT LoRA folder or GGUF LoRA file, applied unmerged
  int group_size = 64, context = 0, max_queue = 256, grace = 10;
  bool int8_activations = false;  // tensor::set_int8_activations
  serve::ServerOptions server;
  engine::EngineOptions engine = serving_engine();
};

std::string tokenizer_path(const ServeFlags& f, const OpenedModel& opened) {
  if (auto path = model_tokenizer_path(f.tokenizer, opened)) return *path;
  throw UsageError(f.model + ": no tokenizer recorded with the model; pass --tokenizer PATH");
}

// What each device of the tensor axis holds, a line each (the chat page's status line).
std::vector<std::string> device_holds(const model::LlamaConfig& c, const model::Placement& placement) {
  std::vector<std::string> out;
  const auto range = [](const dist::Range& r, int of) {
    return std::to_string(r.offset) + "-" + std::to_string(r.offset + r.count - 1) + " of " + std::to_string(of);
  };
  for (const model::ShardPlan& p : placement.plans())
    out.push_back("device " + std::to_string(p.rank) + ": query heads " + range(p.heads, c.n_heads) + ", KV heads " +
                  range(p.kv_heads, c.n_kv_heads) + ", FFN rows " + range(p.ffn, c.hidden_dim) + ", vocabulary rows " +
                  range(p.vocab, c.vocab_size));
  if (placement.expert_devices() > 1)
    out.push_back("experts dealt over " + std::to_string(placement.expert_devices()) + " expert groups");
  return out;
}

// SIGINT / SIGTERM, taken by one thread (sigwait) instead of a handler: stopping the server is
// no async-signal-safe work.
class ShutdownSignals {
 public:
  ShutdownSignals() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);  // before any thread starts: they inherit the mask
    std::signal(SIGPIPE, SIG_IGN);
  }
  // Waits for a signal, or for `done`; true for a signal.
  bool wait(const std::atomic<bool>& done) const {
    const timespec tick{0, 200'000'000};
    while (!done) {
      if (sigtimedwait(&set_, nullptr, &tick) > 0) return true;
    }
    return false;
  }

 private:
  sigset_t set_;
};

// Stops accepting, gives running requests `grace` to finish, cancels the rest, ends the engine.
void drain(serve::HttpServer* http, serve::EngineService& service, int grace) {
  if (http) http->stop();
  service.close();
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(grace);
  while (service.in_flight() > 0 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (service.in_flight() > 0) std::fprintf(stderr, "tpcli serve: %d requests cancelled at shutdown\n", service.in_flight());
  service.shutdown();
}

void run_serve(const ServeFlags& f, const RunFlags& run_flags) {
  const ShutdownSignals signals;
  const InferenceAxes where = inference_mesh_from_flags(run_flags);
  const dist::Mesh& mesh = where.mesh;
  dist::RunOptions run_options;
  try {
    dist::select_backend(run_options, run_flags.backend, mesh.size());
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  const bool leads = run_options.local_ranks.empty() || run_options.local_ranks.front() == 0;
  if (f.server.port < 0 || f.server.port > 65535) throw UsageError("--port " + std::to_string(f.server.port) + " must be 0 to 65535");
  if (f.engine.parallel < 1) throw UsageError("--parallel " + std::to_string(f.engine.parallel) + " must be >= 1");
  if (f.max_queue < 0) throw UsageError("--max-queue must be >= 0");
  if (f.engine.busy_prefill_tokens < 0) throw UsageError("--prefill-chunk must be >= 0");
  serve::ServiceOptions service_options{f.engine, f.max_queue};
  if (!f.kv_memory.empty()) service_options.engine.kv_memory = parse_bytes(f.kv_memory, "--kv-memory");
  service_options.engine.kv_dtype = parse_kv_dtype(f.kv_dtype);

  OpenedModel opened = open_model(f.model, parse_quantize_flag(f.quantize, f.group_size));
  apply_load_flags(opened, f.dtype, f.context);
  apply_adapter(opened, f.adapter);
  const model::Placement placement = place_model(opened, f.model, mesh, where.roles);
  tensor::set_int8_activations(f.int8_activations);
  const model::LlamaConfig& config = opened.weights->config();
  try {
    engine::kv_pool_blocks(config, placement.plans(), mesh.size(), service_options.engine);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  const std::string path = tokenizer_path(f, opened);
  // A tokenizer larger than the model would hand the engine ids it has no row for.
  const text::LoadedTokenizer loaded = open_model_tokenizer(path, config.vocab_size);
  std::optional<ChatFormatting> chat;
  if (!f.chat_template.name.empty() || loaded.chat_template) chat = chat_formatting(loaded, f.chat_template);

  serve::ServedModel served;
  served.name = !f.model_name.empty() ? f.model_name : std::filesystem::path(f.model).filename().string();
  served.tokenizer = loaded.tokenizer.get();
  if (chat) {
    served.chat_template = chat->chat_template;
    served.chat_tokens = chat->tokens;
  }
  served.stop_ids = engine::end_of_generation(*loaded.tokenizer, opened.eos_token_ids, chat ? &chat->chat_template : nullptr,
                                             chat ? chat->tokens : text::ChatTokens{})
                        .ids;
  served.mesh = mesh.to_string();
  served.backend = run_flags.backend.empty() ? "threads" : run_flags.backend;
  served.devices = mesh.size();
  served.holds = device_holds(config, placement);

  dist::CollectiveWatch watch(mesh.size());
  run_options.watch = &watch;
  serve::ServerOptions server_options = f.server;
  server_options.devices_stuck = [&watch] { return watch.stuck(DEVICES_STUCK_AFTER); };

  engine::GrammarConstraints grammars(*loaded.tokenizer);  // structured outputs: every device's, and the HTTP side's checks
  service_options.compile_grammar = [&grammars](const std::string& gbnf) { return grammars.compile(gbnf); };
  served.compile_grammar = service_options.compile_grammar;
  serve::EngineService service(service_options);
  std::optional<serve::HttpServer> http;
  int port = 0;
  if (leads) {
    http.emplace(service, served, server_options);
    try {
      port = http->bind();  // a port in use is an error before the model loads
    } catch (const std::runtime_error& e) {
      throw UsageError(std::string("--host/--port: ") + e.what());
    }
  }
  std::atomic<bool> done{false};
  std::thread listener([&] {
    if (!http) return;
    if (!service.wait_ready()) return;
    std::fprintf(stderr, "tpcli serve: %s on %s, listening on http://%s:%d (%s)\n", served.name.c_str(), served.mesh.c_str(),
                 f.server.host.c_str(), port, chat ? "chat and completions" : "completions; chat needs --template");
    http->listen();
  });
  std::thread stopper([&] {
    if (signals.wait(done)) drain(http ? &*http : nullptr, service, f.grace);
  });
  std::optional<std::string> failure;
  try {
    model::run_placed(*opened.weights, placement, run_options,
                      [&](model::Llama& llama, dist::Device& dev) { service.run_device(llama, dev, *loaded.tokenizer); });
  } catch (const std::exception& e) {
    failure = e.what();
    service.fail(e.what());
  }
  done = true;
  if (http) http->stop();
  listener.join();
  stopper.join();
  if (failure) throw std::runtime_error(*failure);
}

void setup_serve(CLI::App& sub) {
  auto flags = std::make_shared<ServeFlags>();
  auto run_flags = add_run_flags(sub, FLAG_DEVICES | FLAG_MESH | FLAG_BACKEND | FLAG_ROLES);
  sub.add_option("--model", flags->model, "checkpoint: llama2.c .bin, tpcli .safetensors or a Hugging Face model directory")->required();
  add_adapter_flag(sub, flags->adapter);
  sub.add_option("-z,--tokenizer", flags->tokenizer, "tokenizer.json, a directory holding it, or a llama2.c tokenizer.bin");
  add_chat_template_flags(sub, flags->chat_template);
  add_reasoning_parser_flag(sub, flags->chat_template);
  sub.add_option("--model-name", flags->model_name, "the model's id in the API (default: the file or folder name)");
  sub.add_option("--host", flags->server.host, "address to listen on (0.0.0.0: every interface)")->capture_default_str();
  sub.add_option("--port", flags->server.port, "port to listen on (0: any free one, printed)")->capture_default_str();
  sub.add_option("--api-key", flags->server.api_key, "ask every request but / and /health for 'Authorization: Bearer KEY'")
      ->envname("TPCLI_API_KEY");
  sub.add_option("--parallel", flags->engine.parallel, "sequences decoding at once")->capture_default_str();
  sub.add_option("--max-queue", flags->max_queue, "requests waiting beyond --parallel; more are answered 429")->capture_default_str();
  sub.add_option("--kv-memory", flags->kv_memory, "bytes of KV pool per device, e.g. 512M (default: --parallel whole contexts, within an eighth of memory)");
  sub.add_option("--kv-blocks", flags->engine.kv_blocks, "KV pool blocks of 16 positions (instead of --kv-memory)");
  add_kv_dtype_flag(sub, flags->kv_dtype);
  sub.add_option("--step-tokens", flags->engine.step_tokens, "rows per forward at most (decode tokens first, then prompt chunks)")
      ->capture_default_str();
  sub.add_option("--prefill-chunk", flags->engine.busy_prefill_tokens,
                 "prompt rows per step while other sequences decode (their inter-token latency; 0: --step-tokens)")
      ->capture_default_str();
  sub.add_option("--grace", flags->grace, "seconds requests may run on after SIGINT/SIGTERM")->capture_default_str();
  sub.add_option("--max-body", flags->server.max_body_bytes, "request body bytes at most (413 beyond)")->capture_default_str();
  sub.add_option("--dtype", flags->dtype, "auto: weights as stored; f32: convert on load")->capture_default_str();
  sub.add_option("--context", flags->context, "positions a sequence may reach, at most the model's (0: the model's)");
  sub.add_option("--quantize", flags->quantize, "quantize an f32 checkpoint on load: 4, 8 (affine), mxfp8, or bf16/f16");
  sub.add_option("--group-size", flags->group_size, "affine group size with --quantize")->capture_default_str();
  add_int8_activations_flag(sub, flags->int8_activations);
  sub.callback([flags, run_flags] { run_serve(*flags, *run_flags); });
}

const bool registered = register_command({"serve", "Serve the OpenAI API (and a chat page) with the model split over devices", setup_serve});

}  // namespace

}  // namespace tpcli::cli
