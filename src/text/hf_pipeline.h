// tpcli::text — the stages of a Hugging Face tokenizer.json around its model, built from the file's
// JSON: normalizers (text -> text), pre-tokenizers (pieces -> finer pieces) and decoders (token
// strings -> text). Each builder throws std::runtime_error naming `where` (file and key) and the
// type it does not support; Sequences nested more than 64 deep are refused. A regex that fails at
// encode time (PCRE2's match limit) throws naming its key and PCRE2's message.
//
// Supported, as the `tokenizers` library defines them:
//   normalizers:     Sequence, NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace, Strip
//   pre-tokenizers:  Sequence, Split (Regex/String; Isolated, Removed, MergedWithPrevious,
//                    MergedWithNext, Contiguous; invert), ByteLevel, Metaspace, Digits
//   decoders:        Sequence, ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip
// Regexes run on PCRE2 with PCRE2_UTF | PCRE2_UCP, so \p{L}, \p{N} and \s are Unicode classes as
// in the Oniguruma engine the Rust library uses.
#pragma once

#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace tpcli::text::hf {

using Normalizer = std::function<std::string(std::string text)>;

// One piece of the text on its way to the model. `at_start`: the piece begins the whole input
// (Metaspace's prepend_scheme "first" prepends only there).
struct Piece {
  std::string text;
  bool at_start = false;
};
using PreTokenizer = std::function<std::vector<Piece>(std::vector<Piece> pieces)>;
using Decoder = std::function<std::vector<std::string>(std::vector<std::string> tokens)>;

Normalizer make_normalizer(const nlohmann::json& spec, const std::string& where);
PreTokenizer make_pre_tokenizer(const nlohmann::json& spec, const std::string& where);
Decoder make_decoder(const nlohmann::json& spec, const std::string& where);

// GPT-2's byte -> printable code point map (bytes that print stand for themselves, the others
// shift to U+0100 and up), as UTF-8 strings; and its inverse (-1: not a mapped character).
const std::vector<std::string>& byte_to_unicode();
int unicode_to_byte(char32_t code_point);

}  // namespace tpcli::text::hf
