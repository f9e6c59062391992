// tpcli::cli — bounding the text a command feeds a model by what the model's context can hold.
//
// A prompt file or a chat line comes from the user and can be anything: /dev/zero, a directory,
// a multi-gigabyte log. Text that cannot fit the context is refused by name before it is read
// whole (from the file's size, or as a line grows), and a prompt is refused again by its token
// count, rather than silently truncated.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tpcli::cli {

// Bytes of text per context position past which no tokenizer's text can fit: a byte vocabulary
// averages 1, BPE on English about 4, a long run of spaces or symbols a few dozen. Generous, so
// nothing that fits is refused.
constexpr int64_t MAX_TEXT_BYTES_PER_POSITION = 256;

// The most bytes of text a context of `seq_len` positions can hold.
int64_t max_text_bytes(int seq_len);

// The exact content of the prompt file `path` (infer -f). Throws UsageError naming the path when
// it is not a readable regular file or holds more than max_text_bytes(seq_len) bytes (checked
// from its size before reading, and again while reading, should it grow).
std::string read_prompt_file(const std::string& path, int seq_len);

// Throws UsageError "SOURCE: the prompt is N tokens, more than the model's context of S
// positions" when `tokens` > `seq_len`. `source` names where the prompt came from.
void require_prompt_fits(const std::string& source, size_t tokens, int seq_len);

// A prompt given as token ids (`--tokens 5,17,3`): comma-separated decimal integers, each in
// [0, vocab_size), at least one and at most `seq_len`. Throws UsageError
// "FLAG VALUE: ..." naming the first bad item otherwise.
std::vector<int> parse_token_ids(const std::string& flag, const std::string& text, int vocab_size, int seq_len);

}  // namespace tpcli::cli
