// tpcli::train — training checkpoints: a safetensors file that is also a complete model file.
//
// out_dir/latest.safetensors holds every parameter (full, unsharded, named as in
// llama_parameters()), the model config ("model.*" metadata, see formats/safetensors.h), the
// tokenizer, and the training state:
//   "train.step"                  completed optimizer steps (= AdamW's t)
//   "train.seed", "train.mesh"    for the record (a resume re-reads the config file)
//   tensors "adam.exp_avg.NAME", "adam.exp_avg_sq.NAME"   AdamW moments, same shape as NAME
// Tokenizer keys:
//   "tokenizer.kind"              "chars" | "bytes" | "llama2c" | "hf" (a tokenizer.json)
//   "tokenizer.chars"             chars only: the vocabulary as decimal byte values, "10,32,33,..."
//   "tokenizer"                   llama2c, hf: absolute path of the tokenizer.bin / tokenizer.json (the key
//                                 `tpcli infer` reads, see formats/safetensors.h)
// Written with temp file + rename, so a kill at any moment leaves the previous one intact; and only
// once the next step's loss and gradient norm say the weights are sound (train/loss_guard.h), so a
// diverging run leaves its last good checkpoint.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "train/data.h"

namespace tpcli::train {

using Metadata = std::map<std::string, std::string>;

void tokenizer_to_metadata(const TextTokenizer& tokenizer, Metadata& metadata);
// The tokenizer a checkpoint records; nullopt when it records none. Throws naming `origin` when
// the keys are malformed. vocab_size is needed to load a llama2c tokenizer file.
std::optional<TextTokenizer> tokenizer_from_metadata(const Metadata& metadata, const std::string& origin,
                                                     int vocab_size);

// out_dir/latest.safetensors
std::string latest_checkpoint(const std::string& out_dir);

constexpr const char* EXP_AVG_PREFIX = "adam.exp_avg.";
constexpr const char* EXP_AVG_SQ_PREFIX = "adam.exp_avg_sq.";

}  // namespace tpcli::train
