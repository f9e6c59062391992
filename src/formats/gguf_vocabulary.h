// tpcli::formats — the tokenizer a GGUF file carries (its tokenizer.ggml.* and tokenizer.chat_template
// keys), as a text::GgufTokenizer; and opening any tokenizer path, GGUF files included.
#pragma once

#include <optional>
#include <string>

#include "formats/gguf_file.h"
#include "text/gguf_tokenizer.h"
#include "text/load_tokenizer.h"

namespace tpcli::formats {

// The tokenizer keys of `file`; nullopt when it has neither tokenizer.ggml.model nor
// tokenizer.ggml.tokens. One-line std::runtime_error naming the file and key for a key of the
// wrong type, or one of the two without the other.
std::optional<text::GgufVocabulary> read_gguf_vocabulary(const gguf::GgufFile& file);

// The tokenizer of the GGUF file `path`, with its chat template. std::runtime_error, one line, when
// the file holds none ("... pass one with -z/--tokenizer") or a bad one.
text::LoadedTokenizer load_gguf_tokenizer(const std::string& path);

// A GGUF file's tokenizer (a file that starts "GGUF"), else text::load_tokenizer's.
text::LoadedTokenizer load_tokenizer(const std::string& path, std::optional<int> vocab_size = std::nullopt);

}  // namespace tpcli::formats
