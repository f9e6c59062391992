// tpcli::cli — a model's tokenizer as the GGUF keys llama.cpp reads (formats::GgufVocabulary), for
// `export --to gguf`.
//
// A llama2.c tokenizer.bin becomes model "llama" (SentencePiece) as llama.cpp's
// convert-llama2c-to-ggml writes it: ids 0/1/2 are "<unk>" (unknown), "<s>" and "</s>" (control),
// "<0xNN>" pieces byte tokens, every other piece normal with its score, spaces spelled "▁".
// A Hugging Face tokenizer.json with a byte-level BPE becomes model "gpt2" as
// convert_hf_to_gguf.py's _set_vocab_gpt2 writes it: the vocabulary by id (added tokens control
// when special, user-defined otherwise, holes "[PADn]" unused), the merges "left right", and
// tokenizer.ggml.pre named after the pre-tokenizer's split regex as llama.cpp's own table holds it
// (llama-vocab.cpp: gpt-2, llama-bpe, qwen2). Either is padded with "[PADn]" unused tokens up to
// the model's vocabulary. BOS/EOS ids, whether BOS is added and the chat template come from the
// tokenizer (and tokenizer_config.json). Anything else is a UsageError naming the file and what.
#pragma once

#include <optional>
#include <string>

#include "formats/gguf_writer.h"

namespace tpcli::cli {

// `path`: a tokenizer.bin, a tokenizer.json or a folder holding one. `bos_id`/`eos_id`: the
// model's own ids (a Hugging Face config), which win over the tokenizer's.
formats::GgufVocabulary gguf_vocabulary(const std::string& path, int vocab_size, std::optional<int> bos_id, std::optional<int> eos_id);

// The llama.cpp name of a byte-level BPE's pre-tokenizer split regex; nullopt for one it has none for.
std::optional<std::string> gguf_pre_tokenizer_name(const std::string& split_regex);

}  // namespace tpcli::cli
