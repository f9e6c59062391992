// tpcli::engine — which generated tokens end a sequence: one rule for infer --batch, eval, chat and
// serve (and any request on the batch engine).
//
// A sequence ends at the model config's eos ids (config.json, or generation_config.json's), at the
// tokenizer's end-of-sequence token, at the chat template's end-of-turn tokens when prompts go
// through one, with a llama2.c tokenizer at BOS too (run.c: BOS delimits stories), and with a GGUF
// file's tokenizer at llama.cpp's end-of-generation tokens (text/gguf_tokenizer.h). A request
// that asks to ignore them (ignore_eos) stops at none.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "text/chat_template.h"
#include "text/tokenizer_interface.h"

namespace tpcli::engine {

struct EndOfGeneration {
  std::vector<int> ids;             // a generated id among these ends the sequence (it is not part of the text)
  std::vector<std::string> texts;   // the same markers as text (the eos and end-of-turn tokens'), for
                                    // cutting a text where a tokenizer spelled one with several tokens
  std::vector<int> stop_ids(bool ignore_eos) const { return ignore_eos ? std::vector<int>{} : ids; }
};

// `config_eos_ids`: the model config's; `chat`: the template prompts are rendered with (null: none).
// Each id once, in this order: the config's, BOS (llama2.c), eos, the end-of-turn tokens'.
EndOfGeneration end_of_generation(const text::TokenizerInterface& tokenizer, std::span<const int> config_eos_ids,
                                  const text::ChatTemplate* chat = nullptr, const text::ChatTokens& chat_tokens = {});

}  // namespace tpcli::engine
