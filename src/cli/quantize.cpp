// tpcli quantize --model IN --out OUT.safetensors [--bits 4|8] [--group-size 32|64|128]
//                [--mode affine|mxfp8]
// Converts any checkpoint tpcli reads into a quantized tpcli safetensors file (MLX's formats,
// ../shared/QUANT.md): each packable matrix NAME (model/packed_weights.h) as NAME (U32 packed
// words), NAME.scales and NAME.biases (F32; mxfp8: NAME.scales only, U8 E8M0); metadata
// quant.bits, quant.group_size, quant.mode. Norms stay f32; the embedding is quantized too (its
// lookup dequantizes one row; a tied classifier reads it packed). An existing OUT is refused unless
// --force; the input never (the same file by inode).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>

#include "cli/commands.h"
#include "cli/model_file.h"
#include "formats/safetensors.h"
#include "model/packed_weights.h"

namespace tpcli::cli {

namespace {

struct QuantizeFlags {
  std::string model, out;
  std::optional<int> bits;  // not given: 4 for affine, 8 for mxfp8 (its only width)
  int group_size = 64;
  std::string mode = "affine";
  bool force = false;  // --force: replace an existing --out (never the input)
};

void run_quantize(const QuantizeFlags& f) {
  const tensor::WeightFormat format = parse_quantization(f.bits.value_or(f.mode == "mxfp8" ? 8 : 4), f.group_size, f.mode);
  if (!f.out.ends_with(".safetensors")) throw UsageError("--out " + f.out + ": expected a .safetensors path");
  check_output_file(f.out, f.model, f.force);
  const OpenedModel opened = open_model(f.model);
  std::unique_ptr<model::ConvertedWeights> converted;
  try {
    converted = std::make_unique<model::ConvertedWeights>(*opened.weights, format);
  } catch (const std::invalid_argument& e) {
    throw UsageError(f.model + ": " + e.what());
  }
  // Keep what the checkpoint recorded (tokenizer, training vocabulary); the config and the
  // quantization are written from the converted weights. A recorded tokenizer path becomes absolute,
  // since the output may live in another folder.
  formats::Metadata metadata;
  for (const auto& [k, v] : opened.metadata)
    if (!k.starts_with("model.") && !k.starts_with("quant.") && !k.starts_with("train.") && !k.starts_with("adam."))
      metadata[k] = v;
  if (opened.tokenizer) metadata["tokenizer"] = std::filesystem::absolute(*opened.tokenizer).lexically_normal().string();
  formats::write_safetensors(f.out, *converted, metadata);
  std::fprintf(stderr, "wrote %s: %s, %.2f MB of weights (was %.2f MB)\n", f.out.c_str(), format.name().c_str(),
               static_cast<double>(model::shard_bytes(*converted, model::plan_shards(converted->config(), 1, 0))) / 1e6,
               static_cast<double>(model::shard_bytes(*opened.weights, model::plan_shards(opened.weights->config(), 1, 0))) / 1e6);
}

void setup_quantize(CLI::App& sub) {
  auto f = std::make_shared<QuantizeFlags>();
  sub.add_option("--model", f->model, "checkpoint to convert: llama2.c .bin, tpcli .safetensors or a Hugging Face directory (f32 or 16-bit)")->required();
  sub.add_option("--out", f->out, "output .safetensors file")->required();
  sub.add_option("--bits", f->bits, "affine: 4 or 8 (default 4); mxfp8: 8, implied");
  sub.add_option("--group-size", f->group_size, "affine: 32, 64 or 128 input columns per scale")->capture_default_str();
  sub.add_option("--mode", f->mode, "affine | mxfp8")->capture_default_str();
  sub.add_flag("--force", f->force, "replace --out if it exists (never the input model)");
  sub.callback([f] { run_quantize(*f); });
}

const bool registered =
    register_command({"quantize", "Write an MLX-quantized copy of a checkpoint (affine 4/8-bit, mxfp8)", setup_quantize});

}  // namespace

}  // namespace tpcli::cli
