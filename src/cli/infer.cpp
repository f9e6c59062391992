// tpcli infer --model PATH [-z TOKENIZER] [--devices N | --mesh [expert=E,]model=N] [-i PROMPT | -f FILE]
//             [-n STEPS] [-t TEMPERATURE] [-p TOPP] [-s SEED] [--dtype auto|f32] [--context N]
//             [--quantize 4|8|mxfp8|bf16|f16 [--group-size G]] [--int8-activations]
//             [--tokens 5,17,3 --ids]
// PATH: a llama2.c .bin, a tpcli .safetensors, or a Hugging Face model directory.
// llama2.c's `run` (generate mode), tensor-parallel: stdout carries exactly what run prints; stderr
// the speed, per-device memory and the bytes collectives moved per token. With a tokenizer.json
// (-z FILE.json or a directory holding one) generation stops at the tokenizer's end-of-sequence
// token and prints the text as that tokenizer decodes it (engine/generate_text.h).
// --tokens IDS --ids: the prompt as token ids, fed exactly (no BOS added), and the generated ids
// (after the prompt) printed as one JSON array, e.g. [509,187,123]; no tokenizer is read and
// nothing stops the run before -n positions (prompt included), so transformers' or llama.cpp's
// greedy ids compare one for one.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "cli/infer_batch.h"
#include "cli/model_file.h"
#include "cli/prompt_text.h"
#include "cli/tokenizer_setup.h"
#include "formats/gguf_model.h"
#include "distributed/select_backend.h"
#include "distributed/trace.h"
#include "engine/end_of_generation.h"
#include "engine/generate.h"
#include "engine/generate_text.h"
#include "model/llama.h"
#include "tensor/packed_matrix.h"
#include "text/tokenizer.h"
#include "train/checkpoint.h"
#include "train/sample.h"

namespace tpcli::cli {

namespace {

struct InferFlags {
  std::string model;
  std::string adapter;  // --adapter: a PEFT LoRA folder or GGUF LoRA file, applied unmerged
  std::string tokenizer;  // "" = from the checkpoint's metadata, else llama2.c's "tokenizer.bin"
  std::string prompt;
  std::string prompt_file;  // -f: the prompt is this file's content, exactly
  int steps = 256;
  float temperature = 1.0f;
  float topp = 0.9f;
  long long seed = 0;  // 0 = from the clock
  engine::SamplingParams sampling;  // --top-k, --min-p, the penalties
  std::string dtype = "auto";  // "f32": convert 16-bit / quantized weights to f32 on load
  int context = 0;             // KV cache positions; 0 = the model's (capped for Hugging Face directories)
  std::string quantize;  // "" = as stored; 4 | 8 | mxfp8 | bf16 | f16: convert an f32 checkpoint on load
  int group_size = 64;
  bool int8_activations = false;  // tensor::set_int8_activations
  std::string batch;   // --batch prompts.jsonl (cli/infer_batch.h)
  ChatTemplateFlags chat_template;  // the template of --batch's "messages" lines
  engine::EngineOptions engine;  // --parallel, --kv-blocks, --step-tokens
  std::string kv_memory;        // --kv-memory SIZE
  std::string kv_dtype = "f32";  // --kv-dtype
  std::string tokens;  // --tokens: the prompt as token ids ("" = -i / -f text)
  bool ids = false;    // --ids: print the generated ids as a JSON array instead of text
  std::string speculate = "off";  // --speculate
};

// The tokenizer file: -z, else the one a safetensors checkpoint records or a GGUF file's own, else
// ./tokenizer.bin.
std::string tokenizer_path(const InferFlags& f, const OpenedModel& opened) {
  if (!f.tokenizer.empty()) return f.tokenizer;
  if (opened.missing_tokenizer && !opened.hf_dir) throw UsageError(*opened.missing_tokenizer);
  return opened.tokenizer.value_or("tokenizer.bin");
}

// A tokenizer.json (or a folder holding one) or a GGUF file: not llama2.c's tokenizer.bin.
bool is_tokenizer_json(const std::string& path) {
  return !path.empty() && (std::filesystem::is_directory(path) || std::filesystem::path(path).extension() == ".json" ||
                           formats::looks_like_gguf(path));
}

// Where the prompt came from, for an error about it: the -f file, else the flag.
std::string prompt_source(const InferFlags& f) { return f.prompt_file.empty() ? "-i/--prompt" : f.prompt_file; }

// A Hugging Face tokenizer (-z tokenizer.json or a directory, else the model's directory or the
// checkpoint's recorded tokenizer.json): stop where every engine command stops
// (engine/end_of_generation.h).
engine::MeshGenerateResult generate_with_tokenizer_json(const InferFlags& f, const model::LlamaConfig& config,
                                                       const OpenedModel& opened, const model::Placement& placement,
                                                       const engine::GenerateOptions& options,
                                                       const dist::RunOptions& run_options, nn::KvDtype kv_dtype) {
  // -z, else the model's directory, else the tokenizer.json a training checkpoint records.
  const std::string path = !f.tokenizer.empty() ? f.tokenizer : opened.hf_dir.value_or(opened.tokenizer.value_or(f.model));
  const text::LoadedTokenizer loaded = open_tokenizer(path);
  const text::TokenizerInterface& tokenizer = *loaded.tokenizer;
  if (tokenizer.vocab_size() > config.vocab_size)
    throw UsageError(loaded.path + ": tokenizer has " + std::to_string(tokenizer.vocab_size()) +
                     " tokens but the model's vocab_size is " + std::to_string(config.vocab_size));
  require_prompt_fits(prompt_source(f), tokenizer.encode_text(options.prompt, true).size(), config.seq_len);
  const std::vector<int> stop_ids = engine::end_of_generation(tokenizer, opened.eos_token_ids).ids;
  return engine::run_model_on_mesh(
      *opened.weights, placement,
      [&](const engine::ModelFns& model, std::FILE* out) {
        return engine::generate_with_tokenizer(model, tokenizer, config.vocab_size, stop_ids, options, out);
      },
      stdout, run_options, kv_dtype);
}

// A checkpoint trained on a chars/bytes vocabulary (train/checkpoint.h) generates through
// train::generate_text (no BOS, no BPE); everything else is llama2.c's generate with a tokenizer.bin.
engine::MeshGenerateResult generate(const InferFlags& f, const OpenedModel& opened, const model::Placement& placement,
                                   const engine::GenerateOptions& options, const dist::RunOptions& run_options,
                                   nn::KvDtype kv_dtype) {
  const model::LlamaConfig& config = opened.weights->config();
  auto kind = opened.metadata.find("tokenizer.kind");
  if (f.tokenizer.empty() && kind != opened.metadata.end() && kind->second != "llama2c") {
    std::optional<train::TextTokenizer> text_tokenizer;
    try {
      text_tokenizer = train::tokenizer_from_metadata(opened.metadata, f.model, config.vocab_size);
    } catch (const std::runtime_error& e) {
      throw UsageError(e.what());
    }
    require_prompt_fits(prompt_source(f), text_tokenizer->encode(options.prompt).size(), config.seq_len);
    return engine::run_model_on_mesh(
        *opened.weights, placement,
        [&](const engine::ModelFns& model, std::FILE* out) {
          const auto start = std::chrono::steady_clock::now();
          train::TextSample sample =
              train::generate_text(model, *text_tokenizer, options.prompt, options.steps, config.seq_len,
                                   options.temperature, options.topp, options.seed, out);
          if (out) std::fputc('\n', out);
          engine::GenerateResult r;
          r.text = sample.text + "\n";
          r.tokens = std::move(sample.tokens);
          r.positions = static_cast<int>(r.tokens.size()) - 1;
          const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          r.tokens_per_second = seconds > 0 ? r.positions / seconds : 0;
          return r;
        },
        stdout, run_options, kv_dtype);
  }
  // A tokenizer.json: -z FILE.json or a directory, else a Hugging Face model directory's own.
  if (is_tokenizer_json(tokenizer_path(f, opened)) || (f.tokenizer.empty() && opened.hf_dir))
    return generate_with_tokenizer_json(f, config, opened, placement, options, run_options, kv_dtype);
  std::unique_ptr<text::Tokenizer> tokenizer;
  try {
    tokenizer = std::make_unique<text::Tokenizer>(tokenizer_path(f, opened), config.vocab_size);
  } catch (const std::runtime_error& e) {
    throw UsageError(e.what());
  }
  require_prompt_fits(prompt_source(f), tokenizer->encode(options.prompt, true, false).size(), config.seq_len);
  return engine::generate_on_mesh(*opened.weights, *tokenizer, placement, options, stdout, run_options, kv_dtype);
}

// --tokens with --ids: the ids fed exactly, every position up to -n run, the ids after the prompt
// printed by device 0 as one JSON array.
engine::MeshGenerateResult generate_ids(const std::vector<int>& prompt, const OpenedModel& opened, const model::Placement& placement,
                                       const engine::GenerateOptions& options, const dist::RunOptions& run_options,
                                       nn::KvDtype kv_dtype) {
  const int vocab = opened.weights->config().vocab_size;
  return engine::run_model_on_mesh(
      *opened.weights, placement,
      [&](const engine::ModelFns& model, std::FILE* out) {
        engine::GenerateResult r = engine::generate_from_ids(model, prompt, vocab, options);
        if (out) {
          std::string json = "[";
          for (size_t i = prompt.size(); i < r.tokens.size(); ++i)
            json += (i > prompt.size() ? "," : "") + std::to_string(r.tokens[i]);
          json += "]\n";
          std::fwrite(json.data(), 1, json.size(), out);
          r.text = std::move(json);
        }
        return r;
      },
      stdout, run_options, kv_dtype);
}

// Per device: memory and traffic. Under `tpcli launch` (zmq) a rank knows only its own devices,
// so it reports those (the launcher prefixes the lines of ranks > 0 with "[rank] ").
void print_device_report(const engine::MeshGenerateResult& r, const std::vector<int>& local_ranks) {
  const double per_token = r.result.positions > 0 ? 1.0 / r.result.positions : 0.0;
  for (size_t d = 0; d < r.devices.size(); ++d) {
    if (!local_ranks.empty() && std::find(local_ranks.begin(), local_ranks.end(), static_cast<int>(d)) == local_ranks.end())
      continue;
    const engine::DeviceReport& dev = r.devices[d];
    std::fprintf(stderr, "device %zu: parameters %.2f MB, KV cache %.2f MB, moved %.1f KB/token\n", d,
                 dev.parameter_bytes / 1e6, dev.kv_cache_bytes / 1e6, dev.bytes_moved * per_token / 1e3);
  }
}

// What speculation did: the guesses checked and taken, and the forwards the tokens took.
void print_speculation(const engine::GenerateResult& r) {
  const double rate = r.guessed > 0 ? 100.0 * static_cast<double>(r.guessed_right) / static_cast<double>(r.guessed) : 0;
  std::fprintf(stderr, "speculation: %lld of %lld guesses right (%.1f%%), %d positions in %lld forwards\n",
               static_cast<long long>(r.guessed_right), static_cast<long long>(r.guessed), rate, r.positions,
               static_cast<long long>(r.steps));
}

void run_infer(const InferFlags& f, const RunFlags& run_flags) {
  const nn::KvDtype kv_dtype = parse_kv_dtype(f.kv_dtype);
  const InferenceAxes where = inference_mesh_from_flags(run_flags);
  const dist::Mesh& mesh = where.mesh;
  const dist::LinkSpec links = links_from_flags(run_flags);
  for (const auto& [axis, link] : links)
    if (!mesh.has_axis(axis))
      throw UsageError("--link " + axis + ": the mesh " + mesh.to_string() + " has no axis '" + axis + "'");
  OpenedModel opened = open_model(f.model, parse_quantize_flag(f.quantize, f.group_size));
  apply_load_flags(opened, f.dtype, f.context);
  apply_adapter(opened, f.adapter);
  const model::Placement placement = place_model(opened, f.model, mesh, where.roles);
  tensor::set_int8_activations(f.int8_activations);
  const model::LlamaConfig& config = opened.weights->config();
  std::vector<int> prompt_ids;  // --tokens
  if (!f.tokens.empty() || f.ids) prompt_ids = parse_token_ids("--tokens", f.tokens, config.vocab_size, config.seq_len);
  engine::GenerateOptions options;
  if (prompt_ids.empty())
    options.prompt = f.prompt_file.empty() ? f.prompt : read_prompt_file(f.prompt_file, config.seq_len);
  options.steps = f.steps;
  options.temperature = f.temperature;
  options.topp = f.topp;
  options.seed = static_cast<uint64_t>(f.seed);  // as run.c: a negative int wraps around
  check_sampling_flags(f.sampling, config.vocab_size);
  options.sampling = f.sampling;
  options.guesses = parse_speculate(f.speculate);
  try {
    options = engine::normalized(options, config.seq_len);  // rejects a NaN -t / -p
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }

  dist::RunOptions run_options;
  try {
    dist::select_backend(run_options, run_flags.backend, mesh.size());  // zmq, mpi: only this process's devices run here
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  run_options.links = links;
  const bool hosts_rank_0 = run_options.local_ranks.empty() || run_options.local_ranks.front() == 0;
  const bool sampling = !f.batch.empty() || options.temperature > 0;
  if (sampling && hosts_rank_0 && !placement.split_invariant())
    std::fprintf(stderr,
                 "note: on this mesh (%s) the logits may differ from 1 device's in their last bits, so sampled text may "
                 "too (the same bits: 1, 2, 4 or 8 devices that each hold whole lanes of wo and w2, no MoE; README)\n",
                 mesh.to_string().c_str());
  std::optional<dist::Trace> trace;
  if (!run_flags.trace.empty()) {
    check_trace_path(run_flags.trace, !run_options.local_ranks.empty());
    run_options.trace = &trace.emplace();
  }
  if (!f.batch.empty()) {
    const std::string tokenizer = !f.tokenizer.empty() ? f.tokenizer : opened.hf_dir.value_or(tokenizer_path(f, opened));
    engine::EngineOptions engine = f.engine;
    if (!f.kv_memory.empty()) engine.kv_memory = parse_bytes(f.kv_memory, "--kv-memory");
    engine.kv_dtype = kv_dtype;
    engine.speculation.guesses = options.guesses;
    run_infer_batch({f.batch, tokenizer, f.chat_template, f.steps > 0 ? f.steps : config.seq_len, options.temperature, options.topp,
                     static_cast<unsigned long long>(options.seed), options.sampling, engine},
                    opened, placement, run_options);
    return;
  }
  const engine::MeshGenerateResult r = prompt_ids.empty() ? generate(f, opened, placement, options, run_options, kv_dtype)
                                                         : generate_ids(prompt_ids, opened, placement, options, run_options, kv_dtype);
  std::fflush(stdout);
  if (trace) write_trace(*trace, run_flags.trace, "forward passes");

  if (r.result.prefill_tokens > 0)
    std::fprintf(stderr, "prompt: %d tokens in one batch, %.1f tok/s\n", r.result.prefill_tokens,
                 r.result.prefill_tokens_per_second);
  if (r.result.tokens_per_second > 0) std::fprintf(stderr, "achieved tok/s: %f\n", r.result.tokens_per_second);
  if (options.guesses > 0) print_speculation(r.result);
  print_device_report(r, run_options.local_ranks);
}

void setup_infer(CLI::App& sub) {
  auto flags = std::make_shared<InferFlags>();
  auto run_flags = add_run_flags(sub, FLAG_DEVICES | FLAG_MESH | FLAG_BACKEND | FLAG_TRACE | FLAG_LINK | FLAG_ROLES);
  sub.add_option("--model", flags->model, "checkpoint: llama2.c .bin, tpcli .safetensors or a Hugging Face model directory")
      ->required();
  add_adapter_flag(sub, flags->adapter);
  sub.add_option("--dtype", flags->dtype, "auto: weights as stored (16-bit, quantized); f32: convert on load")
      ->capture_default_str();
  sub.add_option("--context", flags->context,
                 "positions to hold in the KV cache, at most the model's (0: the model's; Hugging Face "
                 "directories: at most 8192)");
  sub.add_option("-z,--tokenizer", flags->tokenizer,
                 "llama2.c tokenizer.bin, or a tokenizer.json / directory holding one (default: the checkpoint's recorded "
                 "tokenizer, else ./tokenizer.bin)");
  auto* prompt = sub.add_option("-i,--prompt", flags->prompt, "input prompt");
  auto* file = sub.add_option("-f,--file", flags->prompt_file, "read the prompt from this file (its exact content)")->excludes(prompt);
  auto* tokens = sub.add_option("--tokens", flags->tokens, "the prompt as comma-separated token ids, fed exactly (no BOS added); with --ids")
                     ->type_name("IDS")
                     ->excludes(prompt)
                     ->excludes(file);
  auto* ids = sub.add_flag("--ids", flags->ids,
                           "print the generated ids (after the prompt) as one JSON array instead of text; needs --tokens, "
                           "reads no tokenizer, runs all -n positions");
  tokens->needs(ids);
  ids->needs(tokens);
  auto* batch = sub.add_option("--batch", flags->batch,
                               "a JSONL file of prompts ({\"prompt\"} or {\"messages\"}, optional max_tokens, temperature, "
                               "top_p, seed, stop, top_k, min_p, presence_penalty, frequency_penalty, repetition_penalty, logit_bias), run with continuous batching; JSONL results in input order")
                    ->excludes(prompt)
                    ->excludes(file)
                    ->excludes(tokens);
  for (CLI::Option* option : add_chat_template_flags(sub, flags->chat_template)) option->needs(batch);
  sub.add_option("--parallel", flags->engine.parallel, "with --batch: sequences decoding at once")->capture_default_str()->needs(batch);
  sub.add_option("--kv-memory", flags->kv_memory,
                 "with --batch: bytes of KV pool per device, e.g. 512M (default: --parallel whole contexts, within an "
                 "eighth of memory)")
      ->needs(batch);
  auto* blocks = sub.add_option("--kv-blocks", flags->engine.kv_blocks, "with --batch: KV pool blocks of 16 positions (instead of --kv-memory)")
                     ->needs(batch);
  blocks->excludes("--kv-memory");
  add_kv_dtype_flag(sub, flags->kv_dtype);
  sub.add_option("--step-tokens", flags->engine.step_tokens,
                 "with --batch: rows per forward at most (decode tokens first, then chunks of prompts)")
      ->capture_default_str()
      ->needs(batch);
  sub.add_option("-n,--steps", flags->steps, "positions to run, prompt included; 0 = seq_len")->capture_default_str();
  sub.add_option("-t,--temperature", flags->temperature, "0 = greedy")->capture_default_str();
  sub.add_option("-p,--topp", flags->topp, "top-p (nucleus) sampling; 0 or 1 = off")->capture_default_str();
  sub.add_option("-s,--seed", flags->seed, "random seed (default: the clock)");
  add_sampling_flags(sub, flags->sampling);
  add_speculate_flag(sub, flags->speculate);
  sub.add_option("--quantize", flags->quantize, "quantize an f32 checkpoint on load: 4, 8 (affine), mxfp8, or bf16/f16");
  sub.add_option("--group-size", flags->group_size, "affine group size with --quantize: 32, 64, 128")->capture_default_str();
  add_int8_activations_flag(sub, flags->int8_activations);
  sub.callback([flags, run_flags] { run_infer(*flags, *run_flags); });
}

const bool registered = register_command({"infer", "Generate text with a model split over devices", setup_infer});

}  // namespace

}  // namespace tpcli::cli
