#include "model/tokenizer_interface.h"

#include "model/utf8.h"

namespace tpcli::model {

namespace {

constexpr std::string_view REPLACEMENT_CHARACTER = "\xEF\xBF\xBD";  // U+FFFD, what lossy decoders emit

}  // namespace

std::string DecodeStream::push(int id) {
  ids_.push_back(id);
  const std::string text = tokenizer_.decode_ids(ids_, /*clean_up=*/false);
  // Decoders that turn bytes into text replace an unfinished character by U+FFFD (Hugging Face) or
  // leave its first bytes (llama2.c): either way the next token may still complete it.
  size_t final_bytes = text.size() - utf8::incomplete_tail(text);
  if (std::string_view(text).substr(0, final_bytes).ends_with(REPLACEMENT_CHARACTER))
    final_bytes -= REPLACEMENT_CHARACTER.size();
  if (final_bytes <= emitted_) return {};
  std::string fresh = text.substr(emitted_, final_bytes - emitted_);
  emitted_ = final_bytes;
  return fresh;
}

std::string DecodeStream::finish() {
  const std::string text = tokenizer_.decode_ids(ids_, /*clean_up=*/false);
  if (text.size() <= emitted_) return {};
  std::string rest = text.substr(emitted_);
  emitted_ = text.size();
  return rest;
}

}  // namespace tpcli::model
