// tpcli::train — supervised fine-tuning examples: JSONL files parsed in one place (the trainer's
// data, train/sft_batches.h, and `tpcli eval` read them alike), and each example turned into
// tokens with a loss mask.
//
// Dimension legend: n tokens of one example (its inputs are tokens[0, n-1), its targets
// tokens[1, n): an example of n tokens trains n - 1 positions).
//
// One JSON object per line (blank lines are skipped; a file with no example is an error):
//   chat         {"messages": [{"role": "system" | "user" | "assistant", "content": "..."}, ...]}
//                rendered with a chat template (text/chat_template.h); the loss counts the
//                assistants' content and the token(s) that end their turn ("<|im_end|>", eos), as
//                TRL's assistant-only loss does, not the role headers nor the other turns.
//   completions  {"prompt": "...", "completion": "..."}: BOS (when the tokenizer has one), the
//                prompt, the completion, EOS (when it has one); the loss counts the completion and EOS.
//   text         {"text": "..."}: BOS, the text, EOS; every token counts.
// train_on_prompt = true counts every token (of every format).
// Other keys of a line are ignored. Every problem is an SftDataError "FILE:LINE: what".
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "text/chat_template.h"

namespace tpcli::text {
class TokenizerInterface;
}

namespace tpcli::train {

class SftDataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class SftFormat { Chat, Completions, Text };

std::string_view sft_format_name(SftFormat format);  // "chat" | "completions" | "jsonl-text"

// One line of a JSONL file, as parsed (no tokens yet).
struct SftExample {
  std::string where;  // "FILE:LINE", for errors
  std::vector<text::ChatMessage> messages;  // chat
  std::string prompt, completion;            // completions
  std::string text;                          // text
};

// Every example of `path`. Throws SftDataError "FILE:LINE: ..." for a line that is not valid JSON,
// not an object of the format's shape, or (chat) has an unknown role or no assistant message;
// "FILE: ..." when the file cannot be read or holds no example.
std::vector<SftExample> read_sft_examples(const std::string& path, SftFormat format);

// How examples become tokens.
struct SftEncoding {
  SftFormat format = SftFormat::Chat;
  const text::TokenizerInterface* tokenizer = nullptr;  // not owned
  text::ChatTemplate chat_template;  // chat only
  text::ChatTokens chat_tokens;      // the tokenizer's bos/eos text, as the template writes them
  bool train_on_prompt = false;
};

// An example's tokens and which of them are targets the loss counts.
struct EncodedExample {
  std::vector<int> tokens;       // (n,)
  std::vector<uint8_t> counted;  // (n,) 1 where tokens[i] is a counted target (counted[0] is unused)
  int64_t counted_targets() const;  // counted ones among tokens[1, n)
};

// The example's tokens and mask. Chat: the conversation rendered and cut into segments (the text
// before each assistant's content, the content up to and including its end-of-turn token, the
// rest), each segment encoded on its own (no BOS added: the template writes it where it wants one).
// Throws SftDataError "WHERE: ..." when the template refuses the conversation.
EncodedExample encode_example(const SftExample& example, const SftEncoding& encoding);

// An example of more than seq_len + 1 tokens: cut to seq_len + 1 when `truncate`, else an
// SftDataError "WHERE: the example is N tokens, more than train.seq_len + 1 = M ...". Fewer than 2
// tokens is an error too (nothing to train), and so is a cut that leaves no counted target.
void fit_example(EncodedExample& example, const std::string& where, int seq_len, bool truncate);

// Every example of `path` read, encoded and fitted to seq_len.
std::vector<EncodedExample> encode_sft_file(const std::string& path, const SftEncoding& encoding, int seq_len,
                                            bool truncate);

// What `tpcli eval` feeds and expects: chat, every message but the last (which must be the
// assistant's) rendered with the generation prompt; completions, BOS and the prompt. The
// reference is the last assistant message or the completion. Text examples have no prompt:
// SftDataError.
struct EvalCase {
  std::string where;  // "FILE:LINE"
  std::vector<int> prompt;
  std::string reference;
};
EvalCase eval_case(const SftExample& example, const SftEncoding& encoding);

// `text` without leading and trailing whitespace (the comparison of `tpcli eval`).
std::string trim_whitespace(std::string_view text);

}  // namespace tpcli::train
