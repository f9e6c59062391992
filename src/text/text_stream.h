// tpcli::text — a sequence's generated tokens as text, sent as soon as it is final.
//
// Each token's text is what decoding the tokens so far adds to decoding them without it, over a
// window that starts a few tokens back (vLLM's and TGI's incremental detokenizing): a SentencePiece
// word start or a byte-fallback sequence only makes sense with its neighbours. Text is held back
// while it ends in an unfinished UTF-8 sequence (or the U+FFFD a lossy decoder puts for one), for a
// few tokens at most (bytes that never make a character are sent as decoded), or in what could be
// the start of a stop string;
// a stop string, once met, ends the text before it (it is never sent).
#pragma once

#include <span>
#include <string>
#include <vector>

#include "text/tokenizer_interface.h"

namespace tpcli::text {

class TextStream {
 public:
  TextStream(const TokenizerInterface& tokenizer, std::span<const int> prompt, std::vector<std::string> stop);

  // The next generated token; returns the text now final (often empty while held back).
  std::string add(int token);
  // At the sequence's end: the text still held back (none after a stop string).
  std::string flush();
  bool stopped() const { return stopped_; }  // a stop string was met
  const std::string& text() const { return text_; }  // everything decoded so far, up to a stop string

 private:
  std::string decode(size_t from, size_t to) const;
  std::string release();

  const TokenizerInterface& tokenizer_;
  std::vector<std::string> stop_;
  size_t longest_stop_ = 0;
  std::vector<int> ids_;    // the prompt's last tokens, then every generated one
  size_t prefix_ = 0;       // the window's start in ids_
  size_t read_ = 0;         // ids_ before this are in text_
  std::string text_;        // decoded continuation, cut at a stop string
  size_t sent_ = 0;         // bytes of text_ returned
  bool stopped_ = false;
};

}  // namespace tpcli::text
