// tpcli::formats — opening a model by its path, whatever its format: a Hugging Face (or MLX) model
// directory, a tpcli .safetensors checkpoint, a GGUF file (llama.cpp's), or a llama2.c .bin file.
//
//   formats::OpenedModel opened = formats::open("models/stories260K.bin");
//   const LlamaConfig& c = opened.weights->config();
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/weights.h"

namespace tpcli::formats {

struct OpenedModel {
  std::unique_ptr<model::WeightSource> weights;
  std::unique_ptr<model::WeightSource> original;  // the file, when `weights` converts it on load
  // The tokenizer recorded in a safetensors checkpoint's "tokenizer" metadata, resolved against
  // the checkpoint's folder; a GGUF file's own path when it carries a tokenizer (nullopt for
  // llama2.c files, which record none).
  std::optional<std::string> tokenizer;
  std::map<std::string, std::string> metadata;  // a safetensors checkpoint's; empty for llama2.c
  // A Hugging Face model directory: its path (its tokenizer is DIR/tokenizer.json) and the token
  // ids of its config.json / generation_config.json (a GGUF file: tokenizer.ggml.bos_token_id, and
  // eos_token_id, eot_token_id, eom_token_id). nullopt for the other formats.
  std::optional<std::string> hf_dir;
  // A GGUF file without tokenizer keys: the one-line error for a command that needs its tokenizer
  // (a GGUF file that has them names itself in `tokenizer`).
  std::optional<std::string> missing_tokenizer;
  std::optional<int> bos_token_id;
  std::vector<int> eos_token_ids;
};

// Whether `path` is read as safetensors: its name ends in ".safetensors", or its 9th byte starts a
// JSON header. std::runtime_error when it is not a regular file (a FIFO would block the peek).
bool looks_like_safetensors(const std::string& path);

// A directory with a config.json as a Hugging Face model (HfModelDir, MLX-quantized ones too),
// what looks_like_safetensors as a tpcli checkpoint (which must hold a model config), a file that
// starts "GGUF" as GGUF (GgufModel), anything else as llama2.c. Throws std::runtime_error with the loader's one-line message.
OpenedModel open(const std::string& path);

}  // namespace tpcli::formats
