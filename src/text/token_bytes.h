// tpcli::text — each token's raw bytes as it adds them in the middle of a text: what the grammar
// layer's TokenVocabulary needs to constrain decoding (grammar/token_vocabulary.h).
//
//   llama2.c tokenizer.bin   the piece (spaces already spaces), <0xHH> -> that byte; <unk>, <s>, </s> -> ""
//   byte-level BPE (Qwen3, Llama 3, GPT-2)   each character through the inverse of GPT-2's byte map
//   SentencePiece-style BPE (Mistral, Llama 2)   "▁" -> " ", <0xHH> byte-fallback tokens -> that byte
//   added tokens of tokenizer.json (special or not: "<|im_end|>", "<think>")   ""
//   a GGUF file's tokenizer   llama.cpp's token_to_piece: control and unknown tokens "", user-defined ones their text
// Ids run 0..vocab_size()-1; a model whose embedding table is larger pads the rest with "".
#pragma once

#include <string>
#include <vector>

#include "text/tokenizer_interface.h"

namespace tpcli::text {

std::vector<std::string> token_bytes(const TokenizerInterface& tokenizer);

}  // namespace tpcli::text
