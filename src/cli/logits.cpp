// tpcli logits --model PATH --tokens 5,17,3 [--devices N | --mesh [expert=E,]model=N] [--backend threads|zmq|mpi]
//              [--dtype auto|f32] [--context N] [--quantize 4|8|mxfp8|bf16|f16 [--group-size G]] [--int8-activations]
// PATH: a llama2.c .bin, a tpcli .safetensors, or a Hugging Face model directory.
// The logits of every position of a prompt given as token ids (fed exactly, no BOS added), for
// comparing tpcli with transformers or llama.cpp on the same ids: line p of stdout holds the V
// logits after tokens 0..p, space-separated, with 9 significant digits (a float32 round trip).
// No tokenizer is read. The model runs tensor-parallel over the mesh's tensor axis, a MoE's
// experts dealt over its expert axis (model/placement.h) (one batched prefill, Llama::prefill_logits); device 0 prints.
//
// Dimension legend: P prompt positions, V vocab_size.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "cli/model_file.h"
#include "cli/prompt_text.h"
#include "distributed/runtime.h"
#include "distributed/select_backend.h"
#include "model/llama.h"
#include "tensor/packed_matrix.h"

namespace tpcli::cli {

namespace {

struct LogitsFlags {
  std::string model;
  std::string adapter;  // --adapter: a PEFT LoRA folder or GGUF LoRA file, applied unmerged
  std::string tokens;          // --tokens 5,17,3
  std::string dtype = "auto";  // "f32": convert 16-bit / quantized weights to f32 on load
  int context = 0;             // KV cache positions; 0 = the model's (capped for Hugging Face directories)
  std::string quantize;        // "" = as stored
  int group_size = 64;
  bool int8_activations = false;  // tensor::set_int8_activations
};

// logits [P, V], one line per position.
void print_logits(std::FILE* out, const std::vector<float>& logits, int64_t P, int64_t V) {
  std::string line;
  char number[32];
  for (int64_t p = 0; p < P; ++p) {
    line.clear();
    for (int64_t v = 0; v < V; ++v) {
      const int n = std::snprintf(number, sizeof number, v == 0 ? "%.9g" : " %.9g", logits[static_cast<size_t>(p * V + v)]);
      line.append(number, static_cast<size_t>(n));
    }
    line += '\n';
    std::fwrite(line.data(), 1, line.size(), out);
  }
}

void run_logits(const LogitsFlags& f, const RunFlags& run_flags) {
  const InferenceAxes where = inference_mesh_from_flags(run_flags);
  const dist::Mesh& mesh = where.mesh;
  OpenedModel opened = open_model(f.model, parse_quantize_flag(f.quantize, f.group_size));
  apply_load_flags(opened, f.dtype, f.context);
  apply_adapter(opened, f.adapter);
  const model::Placement placement = place_model(opened, f.model, mesh, where.roles);
  tensor::set_int8_activations(f.int8_activations);
  const model::LlamaConfig& config = opened.weights->config();
  const std::vector<int> tokens = parse_token_ids("--tokens", f.tokens, config.vocab_size, config.seq_len);

  dist::RunOptions run_options;
  try {
    dist::select_backend(run_options, run_flags.backend, mesh.size());  // zmq, mpi: only this process's devices run here
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  std::vector<float> logits;  // [P, V] device 0's (empty in a process without device 0)
  model::run_placed(
      *opened.weights, placement, run_options,
      [&](model::Llama& llama, dist::Device& dev) {
        std::vector<float> all = llama.prefill_logits(tokens, 0);  // a collective: every device calls it
        if (dev.rank() == 0) logits = std::move(all);
      });
  if (!logits.empty()) print_logits(stdout, logits, static_cast<int64_t>(tokens.size()), config.vocab_size);
  std::fflush(stdout);
}

void setup_logits(CLI::App& sub) {
  auto flags = std::make_shared<LogitsFlags>();
  auto run_flags = add_run_flags(sub, FLAG_DEVICES | FLAG_MESH | FLAG_BACKEND | FLAG_ROLES);
  sub.add_option("--model", flags->model, "checkpoint: llama2.c .bin, tpcli .safetensors or a Hugging Face model directory")
      ->required();
  add_adapter_flag(sub, flags->adapter);
  sub.add_option("--tokens", flags->tokens, "the prompt as comma-separated token ids, fed exactly (no BOS added)")
      ->required()
      ->type_name("IDS");
  sub.add_option("--dtype", flags->dtype, "auto: weights as stored (16-bit, quantized); f32: convert on load")
      ->capture_default_str();
  sub.add_option("--context", flags->context,
                 "positions to hold in the KV cache, at most the model's (0: the model's; Hugging Face "
                 "directories: at most 8192)");
  sub.add_option("--quantize", flags->quantize, "quantize an f32 checkpoint on load: 4, 8 (affine), mxfp8, or bf16/f16");
  sub.add_option("--group-size", flags->group_size, "affine group size with --quantize: 32, 64, 128")->capture_default_str();
  add_int8_activations_flag(sub, flags->int8_activations);
  sub.callback([flags, run_flags] { run_logits(*flags, *run_flags); });
}

const bool registered = register_command(
    {"logits", "Print the logits of every position of a prompt given as token ids (one line per position)", setup_logits});

}  // namespace

}  // namespace tpcli::cli
