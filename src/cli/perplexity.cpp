// tpcli perplexity --model M --data FILE [-z TOKENIZER] [--devices N] [--quantize ...] [-c CTX] [--windows K]
//                  [--decode] [--int8-activations] [--kv-dtype f32|bf16|f16]
// M: a llama2.c .bin, a tpcli .safetensors or a Hugging Face model directory.
// llama.cpp's llama-perplexity for this tool: the text is tokenized once and cut into
// non-overlapping windows of seq_len (or -c) tokens; each window's tokens predict the next one (the first
// token after a window is its last target). Prints the mean negative log-likelihood per token and
// the perplexity exp(mean NLL). The model runs tensor-parallel on the mesh (batched forward; with
// --decode token by token through the decode path, whose kernels differ for quantized weights).
//
// Dimension legend: S seq_len (window), W windows (engine/perplexity.h scores them).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "cli/model_file.h"
#include "cli/tokenizer_setup.h"
#include "distributed/runtime.h"
#include "engine/perplexity.h"
#include "model/llama.h"
#include "tensor/packed_matrix.h"
#include "text/tokenizer.h"
#include "train/checkpoint.h"
#include "train/data.h"

namespace tpcli::cli {

namespace {

struct PerplexityFlags {
  std::string model, data, tokenizer;
  std::string adapter;  // --adapter: a PEFT LoRA folder or GGUF LoRA file, applied unmerged
  int max_windows = 0;  // 0 = all
  int ctx = 0;          // window length; 0 = seq_len
  std::string quantize;
  int group_size = 64;
  bool decode = false;  // token by token through the decode path instead of the batched forward
  bool int8_activations = false;  // tensor::set_int8_activations
  std::string kv_dtype = "f32";
};

// The text's tokens with the tokenizer the model was trained with: a chars/bytes vocabulary from
// the checkpoint's metadata, else -z, else a Hugging Face directory's tokenizer.json, else the
// recorded tokenizer, else ./tokenizer.bin; with BOS (a tokenizer.json's, when it has one).
std::vector<int> tokenize(const PerplexityFlags& f, const OpenedModel& opened, const std::string& text) {
  const int vocab = opened.weights->config().vocab_size;
  auto kind = opened.metadata.find("tokenizer.kind");
  try {
    if (f.tokenizer.empty() && kind != opened.metadata.end() && kind->second != "llama2c")
      return train::tokenizer_from_metadata(opened.metadata, f.model, vocab)->encode(text);
    const std::string path = model_tokenizer_path(f.tokenizer, opened).value_or("tokenizer.bin");
    if (!is_llama2c_tokenizer(path)) return open_model_tokenizer(path, vocab).tokenizer->encode_text(text, true);
    return text::Tokenizer(path, vocab).encode(text, true, false);
  } catch (const std::runtime_error& e) {
    throw UsageError(e.what());
  }
}

void run_perplexity(const PerplexityFlags& f, const RunFlags& run_flags) {
  const nn::KvDtype kv_dtype = parse_kv_dtype(f.kv_dtype);
  const InferenceAxes where = inference_mesh_from_flags(run_flags);
  const dist::Mesh& mesh = where.mesh;
  OpenedModel opened = open_model(f.model, parse_quantize_flag(f.quantize, f.group_size));
  apply_adapter(opened, f.adapter);
  const model::Placement placement = place_model(opened, f.model, mesh, where.roles);
  tensor::set_int8_activations(f.int8_activations);
  std::string text;
  try {
    text = train::read_text_file(f.data);
  } catch (const std::runtime_error& e) {
    throw UsageError(e.what());
  }
  const std::vector<int> tokens = tokenize(f, opened, text);
  const int seq_len = opened.weights->config().seq_len;
  if (f.ctx < 0 || f.ctx > seq_len)
    throw UsageError("--ctx " + std::to_string(f.ctx) + ": must be in [1, seq_len = " + std::to_string(seq_len) + "]");
  const int S = f.ctx > 0 ? f.ctx : seq_len;
  int64_t W = (static_cast<int64_t>(tokens.size()) - 1) / S;
  if (f.max_windows > 0) W = std::min<int64_t>(W, f.max_windows);
  if (W < 1)
    throw UsageError(f.data + ": " + std::to_string(tokens.size()) + " tokens, fewer than one window of " +
                     std::to_string(S) + " + 1");
  double nll_sum = 0;  // sum over windows of the window's mean NLL (device 0's)
  const auto start = std::chrono::steady_clock::now();
  model::run_placed(
      *opened.weights, placement, {},
      [&](model::Llama& llama, dist::Device& dev) {
        const double sum = engine::sum_window_nll(llama, tokens, S, W, f.decode);
        if (dev.rank() == 0) nll_sum = sum;
      },
      kv_dtype);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double mean = nll_sum / static_cast<double>(W);
  std::printf("%s: %lld windows x %d tokens, mean NLL %.6f, perplexity %.4f\n", f.model.c_str(),
              static_cast<long long>(W), S, mean, std::exp(mean));
  std::fprintf(stderr, "%.1f tokens/s over %d device(s)\n", static_cast<double>(W * S) / seconds, mesh.size());
}

void setup_perplexity(CLI::App& sub) {
  auto f = std::make_shared<PerplexityFlags>();
  auto run_flags = add_run_flags(sub, FLAG_DEVICES | FLAG_MESH | FLAG_ROLES);
  sub.add_option("--model", f->model, "checkpoint: llama2.c .bin, tpcli .safetensors or a Hugging Face model directory")
      ->required();
  add_adapter_flag(sub, f->adapter);
  sub.add_option("--data", f->data, "text file to score")->required();
  sub.add_option("-z,--tokenizer", f->tokenizer,
                 "llama2.c tokenizer.bin, or a tokenizer.json / directory holding one (default: the model directory's, "
                 "else the checkpoint's recorded one, else ./tokenizer.bin)");
  sub.add_option("-c,--ctx", f->ctx, "window length in tokens (default: the model's seq_len)");
  sub.add_option("--windows", f->max_windows, "score at most this many windows (0 = all)")
      ->capture_default_str()
      ->check(CLI::Range(0, std::numeric_limits<int>::max()));
  sub.add_option("--quantize", f->quantize, "quantize an f32 checkpoint on load: 4, 8 (affine), mxfp8, or bf16/f16");
  sub.add_option("--group-size", f->group_size, "affine group size with --quantize")->capture_default_str();
  add_kv_dtype_flag(sub, f->kv_dtype);
  sub.add_flag("--decode", f->decode,
               "feed each window token by token through the decode path (matrix-vector kernels) instead of the batched forward");
  add_int8_activations_flag(sub, f->int8_activations);
  sub.callback([f, run_flags] { run_perplexity(*f, *run_flags); });
}

const bool registered = register_command(
    {"perplexity", "Mean NLL and perplexity of a text over non-overlapping seq_len windows", setup_perplexity});

}  // namespace

}  // namespace tpcli::cli
