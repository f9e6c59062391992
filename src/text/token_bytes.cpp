#include "text/token_bytes.h"

#include <stdexcept>

#include "text/gguf_tokenizer.h"
#include "text/hf_pipeline.h"
#include "text/hf_tokenizer.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

namespace tpcli::text {

namespace {

// "<0xHH>" -> the byte, else -1.
int byte_token(const std::string& text) {
  if (text.size() != 6 || text.compare(0, 3, "<0x") != 0 || text[5] != '>') return -1;
  int value = 0;
  for (size_t i = 3; i < 5; ++i) {
    const char c = text[i];
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return -1;
    value = value * 16 + d;
  }
  return value;
}

std::vector<std::string> llama2c_bytes(const Tokenizer& tokenizer) {
  std::vector<std::string> out(static_cast<size_t>(tokenizer.vocab_size()));
  for (int id = 0; id < tokenizer.vocab_size(); ++id) {
    if (id == UNK_TOKEN || id == BOS_TOKEN || id == EOS_TOKEN) continue;
    const std::string& piece = tokenizer.piece(id);
    const int b = byte_token(piece);
    out[static_cast<size_t>(id)] = b >= 0 ? std::string(1, static_cast<char>(b)) : piece;
  }
  return out;
}

// The bytes a byte-level token stands for; false when a character is outside GPT-2's byte map.
bool byte_level_bytes(const std::string& text, std::string& out) {
  out.clear();
  for (size_t at = 0; at < text.size();) {
    const utf8::CodePoint cp = utf8::decode(text, at);
    const int b = hf::unicode_to_byte(cp.value);
    if (b < 0) return false;
    out += static_cast<char>(b);
    at += cp.length;
  }
  return true;
}

std::vector<std::string> hf_bytes(const HfTokenizer& tokenizer) {
  const int n = tokenizer.vocab_size();
  std::vector<std::string> texts(static_cast<size_t>(n));
  for (int id = 0; id < n; ++id)
    if (!tokenizer.is_added_token(id)) texts[static_cast<size_t>(id)] = tokenizer.token_text(id);
  // Byte-level vocabularies spell every token in GPT-2's map; SentencePiece ones use "▁" (outside it).
  std::vector<std::string> out(static_cast<size_t>(n));
  bool byte_level = true;
  for (int id = 0; id < n && byte_level; ++id) byte_level = byte_level_bytes(texts[static_cast<size_t>(id)], out[static_cast<size_t>(id)]);
  if (!byte_level)
    for (int id = 0; id < n; ++id) {
      const std::string& text = texts[static_cast<size_t>(id)];
      const int b = byte_token(text);
      out[static_cast<size_t>(id)] = b >= 0 ? std::string(1, static_cast<char>(b)) : utf8::replace_all(text, "\xE2\x96\x81", " ");
    }
  // A model writes "<tool_call>" or "<think>" as one token: left out, a grammar that asks for the
  // text would make it spell the text in pieces it was never trained to write.
  for (int id = 0; id < n; ++id)
    if (tokenizer.is_added_token(id) && !tokenizer.is_special_token(id)) out[static_cast<size_t>(id)] = tokenizer.token_text(id);
  return out;
}

// What each token writes (llama.cpp's token_to_piece without special tokens: control and unknown
// tokens write nothing, user-defined ones their text).
std::vector<std::string> gguf_bytes(const GgufTokenizer& tokenizer) {
  std::vector<std::string> out(static_cast<size_t>(tokenizer.vocab_size()));
  for (int id = 0; id < tokenizer.vocab_size(); ++id) out[static_cast<size_t>(id)] = tokenizer.piece(id, false);
  return out;
}

}  // namespace

std::vector<std::string> token_bytes(const TokenizerInterface& tokenizer) {
  if (const auto* llama2c = dynamic_cast<const Tokenizer*>(&tokenizer)) return llama2c_bytes(*llama2c);
  if (const auto* hf = dynamic_cast<const HfTokenizer*>(&tokenizer)) return hf_bytes(*hf);
  if (const auto* gguf = dynamic_cast<const GgufTokenizer*>(&tokenizer)) return gguf_bytes(*gguf);
  throw std::invalid_argument("token_bytes: a tokenizer of unknown kind (neither llama2.c's nor tokenizer.json's)");
}

}  // namespace tpcli::text
