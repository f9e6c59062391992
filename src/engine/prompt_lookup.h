// tpcli::engine — prompt lookup: guesses of a sequence's next tokens taken from the sequence
// itself, with no second model (vLLM's n-gram proposer, llama.cpp's lookup decoding). Where the
// last few tokens appeared before, what followed them then is guessed to follow them again: an
// answer that repeats its prompt (an edit, a summary quoting it, code being changed) is guessed
// right for long runs, and text that never repeats itself gets no guess and costs nothing.
#pragma once

#include <span>
#include <vector>

namespace tpcli::engine {

struct PromptLookup {
  int longest = 4;   // tokens of the sequence's end looked for, the longest first
  int shortest = 2;  // below this a match says too little to guess from
};

// Up to `count` tokens that followed the latest earlier occurrence of the longest end of `tokens`
// (between lookup.longest and lookup.shortest tokens) that occurred before; none when no end did.
std::vector<int> lookup_guesses(std::span<const int> tokens, int count, const PromptLookup& lookup = {});

}  // namespace tpcli::engine
